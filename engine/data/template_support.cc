#include "engine/data/template_support.h"

#include <functional>
#include <set>
#include <vector>

#include "jinja/runtime.h"
#include "jinja/value.h"

namespace slide {
namespace {

using jinja::statement;

// Every name the engine binds on some value (filters and methods share one table per type): a template's values
// are data, so the check cannot know the type at a use and asks only that some type has the name.
const std::set<std::string>& ValueBuiltins() {
  static const std::set<std::string> names = [] {
    std::set<std::string> all;
    const std::vector<jinja::value> samples = {
        jinja::mk_val<jinja::value_int>(0),     jinja::mk_val<jinja::value_float>(0.0),
        jinja::mk_val<jinja::value_string>(""), jinja::mk_val<jinja::value_bool>(false),
        jinja::mk_val<jinja::value_array>(),    jinja::mk_val<jinja::value_object>(),
        jinja::mk_val<jinja::value_none>(),     jinja::mk_val<jinja::value_undefined>("")};
    for (const jinja::value& v : samples)
      for (const auto& [name, fn] : v->get_builtins()) all.insert(name);
    return all;
  }();
  return names;
}

bool IsGlobal(const std::string& name) { return jinja::global_builtins().count(name) != 0; }

// The engine's own aliases (runtime.cpp's apply_filter).
std::string FilterName(std::string name) {
  if (name == "count") return "length";
  if (name == "d") return "default";
  if (name == "e") return "escape";
  if (name == "trim") return "strip";
  return name;
}

// The name a filter or test node applies: `x | name` or `x | name(args)`.
const jinja::identifier* NamedCallee(const jinja::statement_ptr& node) {
  if (const auto* id = jinja::cast_stmt<jinja::identifier>(node)) return id;
  if (const auto* call = jinja::cast_stmt<jinja::call_expression>(node))
    return jinja::cast_stmt<jinja::identifier>(call->callee);
  return nullptr;
}

class Walker {
 public:
  explicit Walker(const std::string& source) : source_(source) {}

  std::string Check(const jinja::program& program) {
    // Names a template binds itself may hold a macro: a call through one is the template's own business.
    Visit(program.body, [&](const statement* node) { CollectBound(node); });
    Visit(program.body, [&](const statement* node) { CheckNode(node); });
    return first_;
  }

 private:
  using NodeFn = std::function<void(const statement*)>;

  // Every node, including the children of the literals the engine's own visitor treats as leaves.
  void Visit(const jinja::statements& roots, const NodeFn& fn) {
    jinja::context ctx;
    std::function<void(const statement*)> walk;
    // Set once: the engine's visit() hands a node's children to it, and it walks each one.
    ctx.visitor = [&](bool, const statement*, std::vector<jinja::visitor_pair> children) {
      for (const auto& [label, kids] : children)
        for (const statement* kid : kids) walk(kid);
    };
    walk = [&](const statement* node) {
      if (node == nullptr) return;
      fn(node);
      if (const auto* a = dynamic_cast<const jinja::array_literal*>(node)) {
        for (const auto& e : a->val) walk(e.get());
      } else if (const auto* t = dynamic_cast<const jinja::tuple_literal*>(node)) {
        for (const auto& e : t->val) walk(e.get());
      } else if (const auto* o = dynamic_cast<const jinja::object_literal*>(node)) {
        for (const auto& [k, v] : o->val) {
          walk(k.get());
          walk(v.get());
        }
      } else {
        node->visit(ctx);
      }
    };
    for (const auto& root : roots) walk(root.get());
  }

  void BindTarget(const statement* target) {
    if (const auto* id = dynamic_cast<const jinja::identifier*>(target)) bound_.insert(id->val);
    if (const auto* t = dynamic_cast<const jinja::tuple_literal*>(target))
      for (const auto& e : t->val) BindTarget(e.get());
  }

  void CollectBound(const statement* node) {
    if (const auto* m = dynamic_cast<const jinja::macro_statement*>(node)) {
      BindTarget(m->name.get());
      for (const auto& arg : m->args) {
        if (const auto* kw = dynamic_cast<const jinja::keyword_argument_expression*>(arg.get()))
          BindTarget(kw->key.get());
        else
          BindTarget(arg.get());
      }
    } else if (const auto* s = dynamic_cast<const jinja::set_statement*>(node)) {
      BindTarget(s->assignee.get());
    } else if (const auto* f = dynamic_cast<const jinja::for_statement*>(node)) {
      BindTarget(f->loopvar.get());
    }
  }

  // At the name the template wrote, so the line and column point at it.
  void Report(const statement* node, const std::string& what) {
    if (first_.empty()) first_ = TemplateLineAndColumn(source_, node->pos) + ": " + what;
  }

  // `x | name(args)` and `x is name(args)` hold a call whose callee is the filter's or test's name, not a function.
  void MarkNamedCall(const jinja::statement_ptr& filter_or_test) {
    if (jinja::cast_stmt<jinja::call_expression>(filter_or_test) != nullptr) named_calls_.insert(filter_or_test.get());
  }

  void CheckFilter(const statement* node, const jinja::statement_ptr& filter) {
    MarkNamedCall(filter);
    const jinja::identifier* id = NamedCallee(filter);
    if (id == nullptr) return Report(node, "a filter that is not a name (the engine applies named filters only)");
    if (ValueBuiltins().count(FilterName(id->val)) == 0)
      Report(id, "filter '" + id->val + "' is not supported by the template engine");
  }

  void CheckNode(const statement* node) {
    if (const auto* f = dynamic_cast<const jinja::filter_expression*>(node)) return CheckFilter(node, f->filter);
    if (const auto* f = dynamic_cast<const jinja::filter_statement*>(node)) return CheckFilter(node, f->filter);
    if (const auto* t = dynamic_cast<const jinja::test_expression*>(node)) {
      MarkNamedCall(t->test);
      const jinja::identifier* id = NamedCallee(t->test);
      if (id == nullptr) return Report(node, "a test that is not a name");
      if (!IsGlobal("test_is_" + id->val))
        Report(id, "test 'is " + id->val + "' is not supported by the template engine");
      return;
    }
    if (const auto* call = dynamic_cast<const jinja::call_expression*>(node); call && !named_calls_.count(node)) {
      if (const auto* id = jinja::cast_stmt<jinja::identifier>(call->callee)) {
        if (!IsGlobal(id->val) && bound_.count(id->val) == 0 && id->val != "caller")
          Report(id, "function '" + id->val + "' is not supported by the template engine");
      } else if (const auto* member = jinja::cast_stmt<jinja::member_expression>(call->callee)) {
        const auto* name = jinja::cast_stmt<jinja::identifier>(member->property);
        if (!member->computed && name != nullptr && ValueBuiltins().count(name->val) == 0 &&
            bound_.count(name->val) == 0)
          Report(name, "method '" + name->val + "()' is not supported by the template engine");
      }
    }
  }

  const std::string& source_;
  std::set<std::string> bound_;
  std::set<const statement*> named_calls_;  // filled before the walk reaches them (parents come first)
  std::string first_;
};

}  // namespace

std::string TemplateLineAndColumn(const std::string& source, size_t pos) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::string FirstUnsupportedConstruct(const jinja::program& program, const std::string& source) {
  return Walker(source).Check(program);
}

}  // namespace slide
