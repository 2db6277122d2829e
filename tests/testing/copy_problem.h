// The copy problem: out = x.clone() over 1024 float32s, the smallest problem
// every layer can run (the bridge, a search, the server, a GPU worker). One
// definition for every test that needs a problem and does not care which:
// its source, its signature (so that `--signature` spares a test torch), and
// WriteCopyProblem, which puts both into a test's directory. Uses the
// evaluator's Signature: a test that includes this links ks_evaluator.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/files.h"
#include "evaluator/signature.h"

namespace ks::testing {

inline constexpr char kCopyProblemSource[] =
    "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x.clone()\n\n"
    "def get_inputs():\n    return [torch.randn(1024)]\n\ndef get_init_inputs():\n    return []\n";

// What the bridge would say of the copy problem in `file`, named `name`.
inline Signature CopySignature(const std::string& file = "copy.py", const std::string& name = "copy") {
  Signature s;
  s.name = name;
  s.file = file;
  s.inputs.push_back({.name = "x", .dtype = DType::kFloat32, .shape = {1024}, .strides = {1}});
  s.outputs.push_back({.name = "out", .dtype = DType::kFloat32, .shape = {1024}, .strides = {1}});
  return s;
}

// The copy problem's files in a test's directory.
struct CopyProblem {
  std::string file;       // <dir>/<name>.py
  std::string signature;  // <dir>/<name>.signature.json, for --signature
  // The file's path, then `--signature` and the signature's: a CLI's problem arguments.
  std::vector<std::string> Args() const { return {file, "--signature", signature}; }
};

// Writes <name>.py and <name>.signature.json into `dir` (a TempDir's path);
// a write that fails fails the test (ADD_FAILURE) and the paths are returned anyway.
inline CopyProblem WriteCopyProblem(const std::filesystem::path& dir, const std::string& name = "copy") {
  CopyProblem p{(dir / (name + ".py")).string(), (dir / (name + ".signature.json")).string()};
  if (Status s = WriteFile(p.file, kCopyProblemSource); !s.ok()) ADD_FAILURE() << s.ToString();
  if (Status s = WriteFile(p.signature, SignatureToJson(CopySignature(p.file, name)).dump()); !s.ok())
    ADD_FAILURE() << s.ToString();
  return p;
}

}  // namespace ks::testing
