#include "evaluator/compile/candidate_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ks {
namespace {

using ::testing::HasSubstr;

TEST(CandidateParserTest, ReadsCudaAndJsonBlocksAmidProse) {
  std::string reply = R"MD(Here is my idea: fuse the two passes.

```cuda
extern "C" __global__ void k(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i];
}
```

And the plan:

```json
{"launches": [{"kernel": "k", "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["x", "out", "x.numel"]}]}
```
Hope this helps!)MD";
  auto c = ParseCandidateMarkdown(reply);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT(c->source, HasSubstr("__global__ void k"));
  EXPECT_THAT(c->plan_json, HasSubstr("\"launches\""));
}

TEST(CandidateParserTest, PrefersTheLastKernelBlockAndTheLastPlan) {
  std::string reply = R"(First attempt:
```cuda
extern "C" __global__ void old_k() {}
```
```json
{"launches": [{"kernel": "old_k", "grid": [1], "block": [1], "args": []}]}
```
A helper you might like:
```cpp
__device__ float sq(float v) { return v * v; }
```
Better version:
```cu
extern "C" __global__ void new_k() {}
```
```json
{"launches": [{"kernel": "new_k", "grid": [1], "block": [1], "args": []}]}
```
)";
  auto c = ParseCandidateMarkdown(reply);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->source, HasSubstr("new_k"));
  EXPECT_THAT(c->plan_json, HasSubstr("new_k"));
}

TEST(CandidateParserTest, AcceptsABarePlanAndUntaggedFences) {
  std::string reply = "```\nextern \"C\" __global__ void k() {}\n```\nplan: {\"launches\": [{\"kernel\": \"k\", "
                      "\"grid\": [1], \"block\": [1], \"args\": []}]}\n";
  auto c = ParseCandidateMarkdown(reply);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT(c->plan_json, HasSubstr("\"kernel\": \"k\""));
}

TEST(CandidateParserTest, ATruncatedReplyStillYieldsItsBlocks) {
  std::string reply = "```json\n{\"launches\": [{\"kernel\": \"k\", \"grid\": [1], \"block\": [1]}]}\n```\n"
                      "```cuda\nextern \"C\" __global__ void k() {\n  // cut off here";
  auto c = ParseCandidateMarkdown(reply);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->source, HasSubstr("cut off"));
}

TEST(CandidateParserTest, SaysWhatIsMissing) {
  EXPECT_THAT(ParseCandidateMarkdown("I think we should use shared memory.").status().message(),
              HasSubstr("no ```cuda block and no launch-plan"));
  EXPECT_THAT(ParseCandidateMarkdown("```cuda\nextern \"C\" __global__ void k() {}\n```\n").status().message(),
              HasSubstr("no launch-plan ```json block"));
  EXPECT_THAT(ParseCandidateMarkdown("```cuda\nextern \"C\" __global__ void k() {}\n```\n```json\n{\"launches\": [\n```\n")
                  .status()
                  .message(),
              HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseCandidateMarkdown("```json\n{\"launches\": []}\n```\n").status().message(),
              HasSubstr("no ```cuda block found"));
}

}  // namespace
}  // namespace ks
