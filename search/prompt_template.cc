#include "search/prompt_template.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "common/files.h"

namespace ks {
namespace {

constexpr int kMaxIncludeDepth = 8;

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Scopes for lookups: the innermost list record first, then the variables.
struct Scope {
  const TemplateVars* vars;
  std::vector<const TemplateRecord*> records;  // innermost last

  const std::string* Find(const std::string& name) const {
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return &f->second;
    }
    return vars->Find(name);
  }
};

class Renderer {
 public:
  Renderer(const std::map<std::string, std::string>* library, std::string name)
      : library_(library), name_(std::move(name)) {}

  // Renders text[pos, ...) until "{{/section}}" (or the end when section is "").
  // Returns the position after the closing tag.
  StatusOr<size_t> Render(const std::string& text, size_t pos, const std::string& section, Scope& scope,
                          int depth, std::string* out) {
    for (;;) {
      size_t open = text.find("{{", pos);
      if (open == std::string::npos) {
        if (!section.empty()) return Error("section '" + section + "' is never closed");
        if (out) out->append(text, pos, std::string::npos);
        return text.size();
      }
      if (out) out->append(text, pos, open - pos);
      size_t close = text.find("}}", open + 2);
      if (close == std::string::npos) return Error("unclosed '{{' at offset " + std::to_string(open));
      std::string tag = Trim(text.substr(open + 2, close - open - 2));
      pos = close + 2;
      if (tag.empty()) return Error("empty tag at offset " + std::to_string(open));
      char kind = tag[0];
      std::string name = (kind == '#' || kind == '^' || kind == '/' || kind == '>') ? Trim(tag.substr(1)) : tag;
      if (name.empty()) return Error("tag '{{" + tag + "}}' names nothing");
      if (kind == '@')
        return Error("section line '{{" + tag + "}}' inside a template's text (a section starts a file's line "
                     "of its own, and only in a template file)");
      if (kind == '/') {
        if (name != section) return Error("'{{/" + name + "}}' closes nothing open" +
                                          (section.empty() ? "" : " (open: '" + section + "')"));
        return pos;
      }
      if (kind == '#' || kind == '^') {
        const auto* list = scope.vars->FindList(name);
        if (!list) {
          if (scope.Find(name)) return Error("'" + name + "' is a string, used as a list");
          return Error("missing list variable '" + name + "'");
        }
        if (kind == '^' || list->empty()) {
          // Run the body once: rendered for ^ with an empty list, skipped otherwise
          // (still parsed, so that an error in it is found either way).
          bool emit = kind == '^' && list->empty();
          KS_ASSIGN_OR_RETURN(size_t end, RenderSkippable(text, pos, name, scope, depth, emit ? out : nullptr));
          pos = end;
        } else {
          size_t end = pos;
          for (const TemplateRecord& rec : *list) {
            scope.records.push_back(&rec);
            StatusOr<size_t> e = Render(text, pos, name, scope, depth, out);
            scope.records.pop_back();
            if (!e.ok()) return e.status();
            end = *e;
          }
          pos = end;
        }
        continue;
      }
      if (kind == '>') {
        if (!library_) return Error("'{{> " + name + "}}' needs a template library");
        if (depth >= kMaxIncludeDepth) return Error("templates include each other too deeply at '" + name + "'");
        auto it = library_->find(name);
        if (it == library_->end()) return Error("includes unknown template '" + name + "'");
        Renderer inner(library_, name);
        Scope inner_scope = scope;
        std::string text_out;
        StatusOr<size_t> r = inner.Render(it->second, 0, "", inner_scope, depth + 1, out ? &text_out : nullptr);
        if (!r.ok()) return r.status().WithContext("template '" + name_ + "'");
        if (out) *out += text_out;
        continue;
      }
      const std::string* value = scope.Find(name);
      if (!value) {
        if (scope.vars->FindList(name)) return Error("'" + name + "' is a list, used as a string");
        return Error("missing variable '" + name + "'");
      }
      if (out) *out += *value;
    }
  }

 private:
  // A section body that is parsed but not emitted (out == null) still checks
  // its string variables against the outer scope only when rendered; when
  // skipped, only its structure is checked.
  StatusOr<size_t> RenderSkippable(const std::string& text, size_t pos, const std::string& section, Scope& scope,
                                   int depth, std::string* out) {
    if (out) return Render(text, pos, section, scope, depth, out);
    // Skipped bodies may name record fields that do not exist outside a record;
    // find the matching close tag by structure alone.
    int level = 0;
    for (;;) {
      size_t open = text.find("{{", pos);
      if (open == std::string::npos) return Error("section '" + section + "' is never closed");
      size_t close = text.find("}}", open + 2);
      if (close == std::string::npos) return Error("unclosed '{{' at offset " + std::to_string(open));
      std::string tag = Trim(text.substr(open + 2, close - open - 2));
      pos = close + 2;
      if (tag.empty()) continue;
      std::string name = Trim(tag.substr(1));
      if (tag[0] == '#' || tag[0] == '^') {
        ++level;
      } else if (tag[0] == '/') {
        if (level == 0) {
          if (name != section) return Error("'{{/" + name + "}}' closes nothing open (open: '" + section + "')");
          return pos;
        }
        --level;
      }
    }
  }

  Status Error(const std::string& what) const { return InvalidArgument("template '" + name_ + "': " + what); }

  const std::map<std::string, std::string>* library_;
  std::string name_;
};

// A line that starts a section: "{{@ name}}" alone on it, blanks around allowed.
bool IsSectionLine(const std::string& line) { return Trim(line).rfind("{{@", 0) == 0; }

bool ValidSectionName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

StatusOr<std::map<std::string, std::string>> SplitTemplateSections(const std::string& stem, const std::string& text) {
  std::map<std::string, std::string> out;
  auto error = [&](int line, const std::string& what) {
    return InvalidArgument("template file '" + stem + ".md' line " + std::to_string(line) + ": " + what);
  };
  std::string* current = nullptr;  // the section being read; null in the note before the first
  int line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    ++line_no;
    if (!IsSectionLine(line)) {
      if (current) *current += line + "\n";
      continue;
    }
    std::string t = Trim(line);
    if (t.size() < 5 || t.compare(t.size() - 2, 2, "}}") != 0 || t.find("}}") != t.size() - 2)
      return error(line_no, "'" + t + "': a section line is '{{@ name}}' alone on its line");
    std::string name = Trim(t.substr(3, t.size() - 5));
    if (!ValidSectionName(name))
      return error(line_no, "'" + t + "': a section's name is letters, digits and '_'");
    auto [it, inserted] = out.emplace(stem + "." + name, "");
    if (!inserted) return error(line_no, "section '" + name + "' appears twice");
    current = &it->second;
  }
  if (out.empty()) {
    out[stem] = text;
    return out;
  }
  for (auto& [name, body] : out)
    while (!body.empty() && body.back() == '\n') body.pop_back();
  return out;
}

TemplateVars& TemplateVars::Set(const std::string& name, std::string value) {
  lists_.erase(name);
  strings_[name] = std::move(value);
  return *this;
}

TemplateVars& TemplateVars::SetList(const std::string& name, std::vector<TemplateRecord> records) {
  strings_.erase(name);
  lists_[name] = std::move(records);
  return *this;
}

const std::string* TemplateVars::Find(const std::string& name) const {
  auto it = strings_.find(name);
  return it == strings_.end() ? nullptr : &it->second;
}

const std::vector<TemplateRecord>* TemplateVars::FindList(const std::string& name) const {
  auto it = lists_.find(name);
  return it == lists_.end() ? nullptr : &it->second;
}

StatusOr<std::string> RenderTemplateText(const std::string& text, const TemplateVars& vars) {
  Renderer r(nullptr, "(text)");
  Scope scope{&vars, {}};
  std::string out;
  KS_ASSIGN_OR_RETURN(size_t end, r.Render(text, 0, "", scope, 0, &out));
  (void)end;
  return out;
}

std::string PromptLibrary::DefaultDir() {
  namespace fs = std::filesystem;
  if (const char* d = std::getenv("KS_DATA_DIR"); d && *d) return (fs::path(d) / "prompts").string();
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    fs::path installed = fs::path(std::string(buf, n)).parent_path().parent_path() / "share" / "kernelsearch" / "prompts";
    std::error_code ec;
    if (fs::is_directory(installed, ec)) return installed.string();
  }
  return std::string(KS_SOURCE_DIR) + "/prompts";
}

StatusOr<PromptLibrary> PromptLibrary::LoadDefault() { return Load(DefaultDir()); }

StatusOr<PromptLibrary> PromptLibrary::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("prompt directory " + dir + " does not exist");
  std::map<std::string, std::string> templates;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".md") continue;
    KS_ASSIGN_OR_RETURN(std::string text, ReadFile(entry.path().string(), 1 << 20));
    KS_ASSIGN_OR_RETURN(auto parts, SplitTemplateSections(entry.path().stem().string(), text));
    for (auto& [name, body] : parts)
      if (!templates.emplace(name, std::move(body)).second)
        return InvalidArgument("two prompt templates are named '" + name + "' in " + dir);
  }
  if (ec) return Internal("listing " + dir + ": " + ec.message());
  if (templates.empty()) return NotFound("no prompt templates (*.md) in " + dir);
  PromptLibrary lib(std::move(templates));
  lib.dir_ = dir;
  return lib;
}

StatusOr<std::string> PromptLibrary::Render(const std::string& name, const TemplateVars& vars) const {
  auto it = templates_.find(name);
  if (it == templates_.end())
    return NotFound("unknown prompt template '" + name + "'" + (dir_.empty() ? "" : " (in " + dir_ + ")"));
  Renderer r(&templates_, name);
  Scope scope{&vars, {}};
  std::string out;
  KS_ASSIGN_OR_RETURN(size_t end, r.Render(it->second, 0, "", scope, 0, &out));
  (void)end;
  return out;
}

std::vector<std::string> PromptLibrary::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, t] : templates_) names.push_back(n);
  return names;
}

}  // namespace ks
