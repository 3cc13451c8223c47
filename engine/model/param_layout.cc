#include "engine/model/param_layout.h"

namespace slide {

UnitBuilder::UnitBuilder(UnitKind kind, std::string name, std::string prefix) : prefix_(std::move(prefix)) {
  unit_.kind = kind;
  unit_.name = std::move(name);
}

void UnitBuilder::Add(const std::string& local, std::vector<int64_t> shape, bool decay) {
  ParamSpec p;
  p.local = local;
  p.name = prefix_ + local;
  p.numel = 1;
  for (int64_t d : shape) p.numel *= d;
  p.shape = std::move(shape);
  p.offset = unit_.numel;
  p.weight_decay = decay;
  unit_.numel += (p.numel + kParamAlignElems - 1) / kParamAlignElems * kParamAlignElems;
  unit_.params.push_back(std::move(p));
}

const ParamSpec* UnitLayout::Find(const std::string& local) const {
  for (const auto& p : params)
    if (p.local == local) return &p;
  return nullptr;
}

int64_t ModelLayout::TotalNumel() const {
  int64_t n = 0;
  for (const auto& u : units) n += u.numel;
  return n;
}

ModelLayout BuildModelLayout(const ModelConfig& cfg) {
  const int64_t h = cfg.hidden_size, q = cfg.q_dim(), kv = cfg.kv_dim(), ff = cfg.intermediate_size;
  ModelLayout model;
  model.tied_embeddings = cfg.tie_word_embeddings;

  UnitBuilder embed(UnitKind::kEmbedding, "embed", "model.");
  embed.Add("embed_tokens.weight", {cfg.vocab_size, h}, true);
  model.units.push_back(embed.Take());

  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    UnitBuilder l(UnitKind::kDecoderLayer, "layer." + std::to_string(i), "model.layers." + std::to_string(i) + ".");
    l.Add("input_layernorm.weight", {h}, false);
    l.Add("self_attn.q_proj.weight", {q, h}, true);
    if (cfg.qkv_bias) l.Add("self_attn.q_proj.bias", {q}, false);
    l.Add("self_attn.k_proj.weight", {kv, h}, true);
    if (cfg.qkv_bias) l.Add("self_attn.k_proj.bias", {kv}, false);
    l.Add("self_attn.v_proj.weight", {kv, h}, true);
    if (cfg.qkv_bias) l.Add("self_attn.v_proj.bias", {kv}, false);
    if (cfg.qk_norm) {
      l.Add("self_attn.q_norm.weight", {cfg.head_dim}, false);
      l.Add("self_attn.k_norm.weight", {cfg.head_dim}, false);
    }
    l.Add("self_attn.o_proj.weight", {h, q}, true);
    if (cfg.o_bias) l.Add("self_attn.o_proj.bias", {h}, false);
    l.Add("post_attention_layernorm.weight", {h}, false);
    l.Add("mlp.gate_proj.weight", {ff, h}, true);
    if (cfg.mlp_bias) l.Add("mlp.gate_proj.bias", {ff}, false);
    l.Add("mlp.up_proj.weight", {ff, h}, true);
    if (cfg.mlp_bias) l.Add("mlp.up_proj.bias", {ff}, false);
    l.Add("mlp.down_proj.weight", {h, ff}, true);
    if (cfg.mlp_bias) l.Add("mlp.down_proj.bias", {h}, false);
    model.units.push_back(l.Take());
  }

  UnitBuilder head(UnitKind::kHead, "head", "");
  head.Add("model.norm.weight", {h}, false);
  if (!cfg.tie_word_embeddings) head.Add("lm_head.weight", {cfg.vocab_size, h}, true);
  model.units.push_back(head.Take());
  return model;
}

at::Tensor ParamView(const ParamSpec& spec, const at::Tensor& flat) {
  return flat.narrow(0, spec.offset, spec.numel).view(spec.shape);
}

std::vector<at::Tensor> UnitViews(const UnitLayout& layout, const at::Tensor& flat) {
  std::vector<at::Tensor> views;
  views.reserve(layout.params.size());
  for (const auto& p : layout.params) views.push_back(ParamView(p, flat));
  return views;
}

}  // namespace slide
