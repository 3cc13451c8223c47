#!/usr/bin/env python3
"""Regenerates tests/fixtures/chat_templates/: real model chat templates and how transformers renders them.

The templates come from the pinned llama-cpp-python source distribution on PyPI (the same archive
third_party/CMakeLists.txt builds the Jinja engine from; its SHA-256 is checked): its models/templates folder, and
for Mistral's v3 format (Mistral-7B-Instruct-v0.3) the template its tests/test-chat-template.cpp carries. Two
families that folder lacks come from pinned PyPI wheels (SHA-256 checked too): Llama 2's from transformers 4.42.4,
whose LlamaTokenizer still built it (default_chat_template, without the default system prompt, as the
Llama-2-chat models' tokenizer_config.json has it), and Gemma 3's from Unsloth's chat_templates.py, which carries it
as printed from the model's tokenizer. Each is rendered for a set of
conversations by transformers' own render_jinja_template (sandboxed jinja2, trim_blocks, lstrip_blocks,
raise_exception, strftime_now), with the variables apply_chat_template passes: messages, tools, documents,
add_generation_prompt, the model's special tokens and the line's extra keys. goldens.json records, per case, those
variables and the rendered text (or the template's error); chat_template_test renders the same variables with our
engine and compares byte for byte.

masks.json records, for the same conversations as dataset lines, the tokens (a fixture tokenizer through
transformers' tokenizer) and which are trained with train_on: assistant (as [first, end) token ranges). Where the template is prefix-preserving
for the conversation, the labels are TRL's (each assistant turn a prompt/completion pair: the completion is what the
conversation through the reply adds to the conversation before it with the generation prompt) and `trl` is true;
elsewhere they follow the rule engine/data/chat_sample.h documents, computed here from transformers' renderings.
scripts/check_masks_with_trl.py runs TRL's own SFTTrainer over the prompt/completion lines to confirm them.

Usage: scripts/make_chat_goldens.py [--archive llama_cpp_python-0.3.36.tar.gz]   (pip: transformers, jinja2)
"""
import argparse
import datetime
import hashlib
import json
import os
import tarfile
import tempfile
import urllib.request

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
URL = ("https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
       f"llama_cpp_python-{VERSION}.tar.gz")
# Templates from elsewhere (see the docstring): file name -> (wheel name, URL, SHA-256, extractor).
TRANSFORMERS_4_42 = ("transformers-4.42.4-py3-none-any.whl",
                     "https://files.pythonhosted.org/packages/6a/dc/23c26b7b0bce5aaccf2b767db3e9c4f5ae4331bd47688c1f2ef091b23696/"
                     "transformers-4.42.4-py3-none-any.whl",
                     "6d59061392d0f1da312af29c962df9017ff3c0108c681a56d1bc981004d16d24")
UNSLOTH = ("unsloth-2026.10.9-py3-none-any.whl",
           "https://files.pythonhosted.org/packages/c4/1b/c8d6f64fb4b45625cb2842bd4fad7e7c8fb4c54afc16e0a9ef444ef10079/"
           "unsloth-2026.10.9-py3-none-any.whl",
           "feb40b99bc4f8c543a36cbd0fe6e1410d6e4ac16bd4d0c731f607adce3d63bb0")
MISTRAL_V3_TEST_NAME = "Mistral-Large-Instruct-2407 (mistralai 'v3' template"
# strftime_now's clock in every golden (the test sets the same instant).
NOW = datetime.datetime(2026, 7, 26, 12, 0, 0)

# Template file in the archive -> the special tokens its model's tokenizer_config.json names (absent = unset).
LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
QWEN = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
GRANITE = {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>"}
GEMMA = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": LLAMA3,
    "meta-llama-Llama-3.2-3B-Instruct.jinja": LLAMA3,
    "meta-llama-Llama-3.3-70B-Instruct.jinja": LLAMA3,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": MISTRAL,
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": MISTRAL,
    "unsloth-mistral-Devstral-Small-2507.jinja": MISTRAL,
    "Qwen-Qwen2.5-7B-Instruct.jinja": QWEN,
    "Qwen-Qwen3-0.6B.jinja": QWEN,
    "Qwen-QwQ-32B.jinja": QWEN,
    "google-gemma-2-2b-it.jinja": GEMMA,
    "microsoft-Phi-3.5-mini-instruct.jinja": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"},
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": DEEPSEEK,
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": DEEPSEEK,
    "ibm-granite-granite-3.3-2B-Instruct.jinja": GRANITE,
    "ibm-granite-granite-4.0.jinja": GRANITE,
    "HuggingFaceTB-SmolLM3-3B.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"},
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": {"bos_token": "<BOS_TOKEN>",
                                                            "eos_token": "<|END_OF_TURN_TOKEN|>"},
    "openai-gpt-oss-120b.jinja": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
    "LFM2.5-Instruct.jinja": {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>"},
    "meta-llama-Llama-2-7b-chat-hf.jinja": MISTRAL,
    "mistralai-Mistral-7B-Instruct-v0.3.jinja": MISTRAL,
    "google-gemma-3-it.jinja": GEMMA,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city's name."},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]},
    },
}
CONVERSATIONS = {
    "single": {"messages": [{"role": "user", "content": "What is the capital of France?"},
                            {"role": "assistant", "content": "The capital of France is Paris."}]},
    "system": {"messages": [{"role": "system", "content": "You are a terse assistant."},
                            {"role": "user", "content": "Name a prime number."},
                            {"role": "assistant", "content": "7"}]},
    "multi_turn": {"messages": [{"role": "user", "content": "Hi!"},
                                {"role": "assistant", "content": "Hello! How can I help?"},
                                {"role": "user", "content": "Add 2 and 3."},
                                {"role": "assistant", "content": "2 + 3 = 5."}]},
    "system_multi_turn": {"messages": [{"role": "system", "content": "Answer in one line."},
                                       {"role": "user", "content": "Colour of the sky?"},
                                       {"role": "assistant", "content": "Blue."},
                                       {"role": "user", "content": "And at night?"},
                                       {"role": "assistant", "content": "Dark, with stars."}]},
    "tools": {"tools": [WEATHER_TOOL],
              "messages": [{"role": "user", "content": "Weather in Paris?"},
                           {"role": "assistant", "content": "",
                            "tool_calls": [{"id": "call0001a", "type": "function",
                                            "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                           {"role": "tool", "tool_call_id": "call0001a", "name": "get_weather",
                            "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
                           {"role": "assistant", "content": "It is 21 °C and clear in Paris."}]},
    "reasoning": {"messages": [{"role": "user", "content": "Is 91 prime?"},
                               {"role": "assistant", "reasoning_content": "91 = 7 * 13.",
                                "content": "No: 91 = 7 × 13."}]},
    "thinking_off": {"enable_thinking": False,
                     "messages": [{"role": "user", "content": "Say yes."},
                                  {"role": "assistant", "content": "Yes."}]},
    # Characters that share their first UTF-8 bytes (思 and 我 both start E6): where renderings part inside one,
    # the spans still end on a character boundary.
    "cjk_system_multi_turn": {"messages": [{"role": "system", "content": "思考一下。"},
                                           {"role": "user", "content": "我想知道。"},
                                           {"role": "assistant", "content": "好的。"},
                                           {"role": "user", "content": "我们走吧。"},
                                           {"role": "assistant", "content": "思路清楚。"}]},
    "text_edges": {"messages": [{"role": "user", "content": "  Quote \"this\" {{ not jinja }} \\n and <b>tags</b>\n\n"},
                                {"role": "assistant", "content": "Done — ünïcödé ✓, 日本語.\n"}]},
}


def fetch_archive(path):
    args_archive = path
    if path is None:
        path = os.path.join(tempfile.gettempdir(), f"llama_cpp_python-{VERSION}.tar.gz")
        if not os.path.exists(path):
            urllib.request.urlretrieve(URL, path)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != SHA256:
        if args_archive is None:
            os.remove(path)  # a broken download is not kept for the next run
        raise SystemExit(f"{path}: SHA-256 {digest}, not the pinned {SHA256}")
    return path


def fetch_pinned(wheel):
    name, url, sha256 = wheel
    path = os.path.join(tempfile.gettempdir(), name)
    if not os.path.exists(path):
        urllib.request.urlretrieve(url, path)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != sha256:
        os.remove(path)
        raise SystemExit(f"{url}: SHA-256 {digest}, not the pinned {sha256}")
    return path


def string_assigned(python_source, target, method=None):
    """The string literal (implicit concatenation included) assigned to `target`, in `method` if given."""
    import ast
    tree = ast.parse(python_source)
    scope = tree
    if method is not None:
        scope = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == method)
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == target for t in node.targets) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    raise SystemExit(f"no string assigned to {target}")


def llama2_template():
    """LlamaTokenizer.default_chat_template of transformers 4.42.4 with use_default_system_prompt false."""
    import zipfile
    with zipfile.ZipFile(fetch_pinned(TRANSFORMERS_4_42)) as z:
        code = z.read("transformers/models/llama/tokenization_llama.py").decode("utf-8")
    default_message = string_assigned(code, "DEFAULT_SYSTEM_PROMPT").replace("\n", "\\n").replace("'", "\\'")
    template = string_assigned(code, "template", "default_chat_template")
    return template.replace("USE_DEFAULT_PROMPT", "false").replace("DEFAULT_SYSTEM_MESSAGE", default_message)


def gemma3_template():
    import zipfile
    with zipfile.ZipFile(fetch_pinned(UNSLOTH)) as z:
        code = z.read("unsloth/chat_templates.py").decode("utf-8")
    return string_assigned(code, "gemma3_template")


def mistral_v3_template(tar):
    """The template_str of llama.cpp's test case for Mistral's v3 format (a C string literal, JSON's escapes)."""
    test = tar.extractfile(f"llama_cpp_python-{VERSION}/vendor/llama.cpp/tests/test-chat-template.cpp").read()
    lines = test.decode("utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if MISTRAL_V3_TEST_NAME in line)
    literal = lines[at + 1].split("/* .template_str= */", 1)[1].strip().rstrip(",")
    return json.loads(literal)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archive")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "chat_templates"))
    args = ap.parse_args()
    import jinja2
    import transformers
    from transformers.utils import chat_template_utils as ctu

    archive = fetch_archive(args.archive)
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/templates/"
    os.makedirs(args.out, exist_ok=True)
    sources = {}
    with tarfile.open(archive) as tar:
        for name in TEMPLATES:
            if name == "meta-llama-Llama-2-7b-chat-hf.jinja":
                sources[name] = llama2_template()
            elif name == "google-gemma-3-it.jinja":
                sources[name] = gemma3_template()
            elif name == "mistralai-Mistral-7B-Instruct-v0.3.jinja":
                sources[name] = mistral_v3_template(tar)
            else:
                sources[name] = tar.extractfile(prefix + name).read().decode("utf-8")
            with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="") as f:
                f.write(sources[name])

    cases = []
    for name, special in TEMPLATES.items():
        # render_jinja_template compiles through this same lru_cached function, so it renders with the pinned clock.
        compiled = ctu._compile_jinja_template(sources[name])
        compiled.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
        for conv_name, line in CONVERSATIONS.items():
            messages = line["messages"]
            extra = {k: v for k, v in line.items() if k not in ("messages", "tools")}
            renders = [(conv_name, messages, False)]
            if messages[-1]["role"] == "assistant":
                renders.append((conv_name + "+prompt", messages[:-1], True))
            for case_name, msgs, gen in renders:
                variables = {"messages": msgs, "tools": line.get("tools"), "documents": None,
                             "add_generation_prompt": gen, **special, **extra}
                case = {"template": name, "case": case_name, "variables": variables}
                try:
                    rendered, _ = ctu.render_jinja_template(
                        conversations=[msgs], tools=line.get("tools"), chat_template=sources[name],
                        add_generation_prompt=gen, **special, **extra)
                    case["rendered"] = rendered[0]
                except Exception as e:  # the template's raise_exception, or an error rendering it
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
    out = {"source": f"llama-cpp-python {VERSION} sdist (sha256 {SHA256}), vendor/llama.cpp/models/templates and "
                     f"tests/test-chat-template.cpp (Mistral v3); {TRANSFORMERS_4_42[0]} (Llama 2), "
                     f"{UNSLOTH[0]} (Gemma 3); SHA-256s in scripts/make_chat_goldens.py",
           "reference": f"transformers {transformers.__version__} render_jinja_template, jinja2 {jinja2.__version__}",
           "now": NOW.isoformat(), "cases": cases}
    with open(os.path.join(args.out, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(TEMPLATES)} templates, {len(cases)} cases ({errors} raise)")
    write_masks(args.out, sources, ctu, transformers)


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def extend_by_ending(text, start, limit, rendering):
    """start + the longest run text[start:start+m] (m <= limit) that `rendering` ends with."""
    best = 0
    for m in range(1, min(limit, len(text) - start) + 1):
        if rendering.endswith(text[start:start + m]):
            best = m
    return start + best


def trained_spans(render, text, messages):
    """The character ranges of `text` trained with train_on: assistant (engine/data/chat_sample.h's rule)."""
    replies = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    prompts = [render(messages[:k], True) for k in replies]
    spans, previous_end = [], 0
    for r, k in enumerate(replies):
        prompt, last = prompts[r], render(messages[:k + 1], False)
        start = common_prefix(text, prompt)
        if start < len(prompt):
            start = extend_by_ending(text, start, len(prompt), prompt)
        start = max(start, previous_end)
        reply = last[common_prefix(last, prompt):]
        end = start + common_prefix(text[start:], reply)
        if end < start + len(reply):
            next_prompt = common_prefix(text, prompts[r + 1]) if r + 1 < len(replies) else len(text)
            if next_prompt > end:
                end = extend_by_ending(text, end, min(len(reply), next_prompt - end), reply)
        if end <= start:
            return None
        spans.append((start, end))
        previous_end = end
    return spans


def write_masks(out_dir, sources, ctu, transformers):
    from transformers import PreTrainedTokenizerFast
    fixtures = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizers")
    tokenizers = {name: PreTrainedTokenizerFast(tokenizer_file=os.path.join(fixtures, name, "tokenizer.json"))
                  for name in ("llama3", "qwen2")}
    cases = []
    for name, special in TEMPLATES.items():
        tok_name = "llama3" if "Llama-3" in name else "qwen2"
        tok = tokenizers[tok_name]
        encode = lambda t: tok.encode(t, add_special_tokens=False)
        lines = list(CONVERSATIONS.items())
        # TRL's conversational prompt/completion: the last reply is the completion.
        for conv_name in ("single", "system", "multi_turn", "tools"):
            line = CONVERSATIONS[conv_name]
            pc = {k: v for k, v in line.items() if k != "messages"}
            pc.update(prompt=line["messages"][:-1], completion=line["messages"][-1:])
            lines.append((conv_name + "/prompt_completion", pc))
        for conv_name, line in lines:
            extra = {k: v for k, v in line.items() if k not in ("messages", "tools", "prompt", "completion")}

            def render(msgs, gen):
                out, _ = ctu.render_jinja_template(conversations=[msgs], tools=line.get("tools"),
                                                   chat_template=sources[name], add_generation_prompt=gen,
                                                   **special, **extra)
                return out[0]
            messages = line["messages"] if "messages" in line else line["prompt"] + line["completion"]
            try:
                text = render(messages, False)
            except Exception:
                continue  # the template refuses the conversation (goldens.json records why)
            ids = encode(text)
            if "prompt" in line:  # the completion trained whole, from where the prompt ends
                prompt = render(line["prompt"], True)
                start = common_prefix(text, prompt)
                if start < len(prompt):
                    start = extend_by_ending(text, start, len(prompt), prompt)
                spans = [(start, len(text))]
            else:
                spans = trained_spans(render, text, messages)
            case = {"template": name, "tokenizer": tok_name, "case": conv_name, "line": line,
                    "special_tokens": special, "text": text, "ids": ids}
            if spans is None:
                case["error"] = "a reply could not be located"
                cases.append(case)
                continue

            def tokens_before(pos):
                if pos == 0:
                    return 0
                if pos >= len(text):
                    return len(ids)
                return common_prefix(encode(text[:pos]), ids)
            labels = [-100] * len(ids)
            for a, b in spans:
                for t in range(tokens_before(a), tokens_before(b)):
                    labels[t] = ids[t]
            # TRL's prompt/completion masks, where the template is prefix-preserving for this conversation.
            trl = [-100] * len(ids)
            trl_defined = True
            for k, m in enumerate(messages):
                if m["role"] != "assistant" or ("prompt" in line and k < len(line["prompt"])):
                    continue
                prompt_ids, full_ids = encode(render(messages[:k], True)), encode(render(messages[:k + 1], False))
                if full_ids[:len(prompt_ids)] != prompt_ids or ids[:len(full_ids)] != full_ids:
                    trl_defined = False
                    break
                for t in range(len(prompt_ids), len(full_ids)):
                    trl[t] = ids[t]
            if trl_defined and trl != labels:
                raise SystemExit(f"{name} {conv_name}: the rule's labels differ from TRL's")
            ranges = []  # the trained tokens as [first, last + 1) ranges
            for t, label in enumerate(labels):
                if label == -100:
                    continue
                if ranges and ranges[-1][1] == t:
                    ranges[-1][1] = t + 1
                else:
                    ranges.append([t, t + 1])
            case.update(trained=ranges, trl=trl_defined)
            cases.append(case)
    with open(os.path.join(out_dir, "masks.json"), "w", encoding="utf-8") as f:
        json.dump({"reference": f"transformers {transformers.__version__}; TRL's prompt/completion rule where "
                                "the template is prefix-preserving", "cases": cases}, f, ensure_ascii=False)
        f.write("\n")
    print(f"masks: {len(cases)} conversations, {sum(c.get('trl', False) for c in cases)} equal to TRL's rule, "
          f"{sum('error' in c for c in cases)} not located")


if __name__ == "__main__":
    main()
