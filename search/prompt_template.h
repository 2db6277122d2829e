// Prompt templates: text files in <data dir>/prompts, rendered with a small
// mustache-like syntax:
//   {{name}}                  a string variable
//   {{#name}}...{{/name}}     the body once per record of a list variable; inside,
//                             {{field}} looks in the record first, then outside
//   {{^name}}...{{/name}}     the body only when the list is empty
//   {{> other}}               another template of the library, same variables
// A file may hold several templates: a line that is exactly "{{@ name}}"
// starts a section, the template "<stem>.<name>" (agent.md's "{{@ compile}}"
// is "agent.compile"); it runs to the next such line, without its trailing
// newlines. What comes before the first section is a note for maintainers,
// never rendered. A file without such lines is one template named by its stem.
// Rendering fails loudly: a missing variable, a string used as a list (or the
// reverse), an unclosed section or an unknown template is an error, never an
// empty gap in a prompt. No escaping: prompts are plain text.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ks {

using TemplateRecord = std::map<std::string, std::string>;

// The variables of one rendering. Plain data; not thread-safe to mutate.
class TemplateVars {
 public:
  TemplateVars& Set(const std::string& name, std::string value);
  TemplateVars& SetList(const std::string& name, std::vector<TemplateRecord> records);
  const std::string* Find(const std::string& name) const;
  const std::vector<TemplateRecord>* FindList(const std::string& name) const;

 private:
  std::map<std::string, std::string> strings_;
  std::map<std::string, std::vector<TemplateRecord>> lists_;
};

// A template text rendered on its own ({{> x}} is an error without a library).
StatusOr<std::string> RenderTemplateText(const std::string& text, const TemplateVars& vars);

// The sections of a template file named `stem` ("agent"), as templates named
// "<stem>.<section>"; `text` whole under `stem` when it has no section lines.
// InvalidArgument, naming the file's line, for a section line that is not
// alone on its line, names nothing, or names a section twice.
StatusOr<std::map<std::string, std::string>> SplitTemplateSections(const std::string& stem, const std::string& text);

// The templates of one directory (every *.md, named by stem: ideas.md → "ideas";
// a file with sections by section: agent.md → "agent.instructions", ...).
// Immutable after loading; thread-safe.
class PromptLibrary {
 public:
  static StatusOr<PromptLibrary> Load(const std::string& dir);
  // KS_DATA_DIR/prompts, else <exe>/../share/kernelsearch/prompts, else the
  // source tree's prompts/ (a build that was not installed).
  static StatusOr<PromptLibrary> LoadDefault();
  static std::string DefaultDir();

  PromptLibrary() = default;
  explicit PromptLibrary(std::map<std::string, std::string> templates) : templates_(std::move(templates)) {}

  // NotFound for a name that is not in the library.
  StatusOr<std::string> Render(const std::string& name, const TemplateVars& vars) const;
  std::vector<std::string> Names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, std::string> templates_;
};

}  // namespace ks
