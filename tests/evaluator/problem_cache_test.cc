// Tests of the reference cache (evaluator/reference/reference_cache.h): its cap, its
// temporary directories, its phases, and the keys of its entries under each
// timing precision. They run the bridge with a real python3 + torch (CPU is
// enough); without one they skip, saying why.
#include "tests/evaluator/problem_test_util.h"

namespace ks {
namespace {

// ---- The bounded cache ------------------------------------------------------------------

TEST(CacheTest, TheCapEvictsTheLeastRecentlyUsedEntry) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  // Room for two entries of two judging and four distribution-shifted sets
  // (plus manifests), not three.
  auto opts = [&](uint64_t seed) {
    ReferenceOptions o = CpuOptions(cache.string(), 2, seed);
    o.cache_cap = 13 * kMatmulSetBytes;
    return o;
  };
  auto a = PrepareReference(Fixture("matmul.py"), opts(1));
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = PrepareReference(Fixture("matmul.py"), opts(2));
  ASSERT_TRUE(b.ok()) << b.status().message();
  auto a_again = PrepareReference(Fixture("matmul.py"), opts(1));  // a is now the most recently used
  ASSERT_TRUE(a_again.ok()) << a_again.status().message();
  EXPECT_TRUE(a_again->from_cache);
  auto c = PrepareReference(Fixture("matmul.py"), opts(3));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->evicted, std::vector<std::string>{fs::path(b->dir).filename().string()});
  EXPECT_TRUE(fs::exists(a->dir));
  EXPECT_FALSE(fs::exists(b->dir));
  auto usage = ReadCacheUsage(cache.string());
  ASSERT_TRUE(usage.ok()) << usage.status().message();
  EXPECT_EQ(usage->entries.size(), 2u);
  EXPECT_LE(usage->entry_bytes, 13 * kMatmulSetBytes);
  EXPECT_EQ(usage->entries.back().path, c->dir);  // most recently used last
}

TEST(CacheTest, SetsBeyondTheCapAreNotPreparedAndTheWarningSaysWhy) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 3);
  o.cache_cap = 2 * kMatmulSetBytes + kMatmulSetBytes / 2;
  auto r = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->sets.size(), 2u);
  EXPECT_EQ(r->sets_requested, 3);
  ASSERT_FALSE(r->warnings.empty());
  EXPECT_THAT(r->warnings[0], HasSubstr("using 2 of the 3 input sets"));
  EXPECT_THAT(r->warnings[0], HasSubstr("cap"));

  // Fewer than two sets cannot tell a kernel that ignores its inputs: refused, saying by how much.
  o.cache_cap = kMatmulSetBytes + kMatmulSetBytes / 2;
  o.sets = 2;
  auto small = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(small.status().message(), HasSubstr("matmul.py"));
  EXPECT_THAT(small.status().message(), HasSubstr("--cache-cap"));
}

TEST(CacheTest, SetsBeyondTheGpuBudgetAreNotPrepared) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 4);
  // GpuEvaluator: the arena holds one set (inputs, outputs); per set, the
  // inputs' pristine copy and the reference outputs.
  const uint64_t in = (64 * 32 + 32 * 48) * 4, out = 64 * 48 * 4;
  o.device_budget = in + out + 3 * (in + out);
  auto r = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->sets.size(), 3u);
  ASSERT_FALSE(r->warnings.empty());
  EXPECT_THAT(r->warnings[0], HasSubstr("GPU memory"));
}

TEST(CacheTest, PracticeSetsFollowTheJudgingSetsAndAreKeptWhereRoomIsShort) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 3);
  o.practice_sets = 1;
  o.practice_seed = 1042;
  auto r = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->JudgingSets(), 3);
  ASSERT_EQ(r->PracticeSets(), std::vector<int>{3});
  EXPECT_EQ(r->sets[3].seed, 1043u);
  EXPECT_TRUE(r->sets[3].transform.empty());
  ASSERT_GT(r->sets.size(), 4u);  // the shifted sets follow
  for (size_t s = 4; s < r->sets.size(); ++s) EXPECT_FALSE(r->sets[s].transform.empty()) << s;
  // Another entry than the reference without practice sets (its own key).
  auto plain = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string(), 3));
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_NE(plain->dir, r->dir);
  EXPECT_TRUE(plain->PracticeSets().empty());

  // Room for four sets: two judging sets, the practice set, one shifted set.
  TempDir small;
  ReferenceOptions tight = CpuOptions(small.path(), 3);
  tight.practice_sets = 1;
  tight.practice_seed = 1042;
  const uint64_t in = (64 * 32 + 32 * 48) * 4, out = 64 * 48 * 4;
  tight.device_budget = in + out + 4 * (in + out);
  auto t = PrepareReference(Fixture("matmul.py"), tight);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->JudgingSets(), 2);
  EXPECT_EQ(t->PracticeSets(), std::vector<int>{2});
  ASSERT_EQ(t->sets.size(), 4u);
  EXPECT_FALSE(t->sets[3].transform.empty());
}

TEST(CacheTest, TemporaryDirectoriesOfKilledRunsAreRemoved) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(waitpid(dead, &status, 0), dead);
  const fs::path stale = fs::path(cache.string()) / (".tmp-matmul-" + std::to_string(dead) + "-0");
  const fs::path live = fs::path(cache.string()) / (".tmp-matmul-" + std::to_string(getpid()) + "-99");
  fs::create_directories(stale / "set0");
  fs::create_directories(live);
  ASSERT_TRUE(WriteFile((stale / "set0" / "x.bin").string(), std::string(4096, 'x')).ok());
  auto r = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));  // a run in progress (this process) is left alone
}

TEST(CacheTest, PhasesSayWhereThePreparationWentAndACacheHitSaysSo) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto first = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(first.ok()) << first.status().message();
  std::vector<std::string> names;
  for (const auto& [name, s] : first->phases) {
    names.push_back(name);
    EXPECT_GE(s, 0.0) << name;
  }
  for (const char* want : {"bridge: model build", "bridge: input generation", "bridge: forward",
                           "bridge: determinism check", "bridge: writing files"})
    EXPECT_THAT(names, ::testing::Contains(want));
  EXPECT_THAT(names[0], HasSubstr("signature"));
  auto hit = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(hit.ok()) << hit.status().message();
  ASSERT_EQ(hit->phases.size(), 1u);
  EXPECT_EQ(hit->phases[0].first, "cache lookup");
}

TEST(CacheTest, ByteSizesParse) {
  EXPECT_EQ(*ParseByteSize("20G"), uint64_t{20} << 30);
  EXPECT_EQ(*ParseByteSize("512M"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), uint64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("100 kb"), uint64_t{102400});
  EXPECT_EQ(*ParseByteSize("1000"), uint64_t{1000});
  for (const char* bad : {"", "G", "-1G", "12X", "1e30"}) EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
}

// ---- The precision the baselines are timed under (issue 36) ----------------------------

bridge_internal::KeyFacts GpuKeyFacts() {
  bridge_internal::KeyFacts k;
  k.problem_bytes = "class Model: ...";
  k.bridge_bytes = "bridge.py";
  k.timing_bytes = "timing.py";
  k.transforms_bytes = "transforms.py";
  k.py.torch_version = "2.5.1";
  k.on_cuda = true;
  k.device_kind = "cuda:NVIDIA H100 80GB HBM3";
  return k;
}

std::string KeyUnder(const bridge_internal::KeyFacts& k, const std::string& precision, bool timed = true,
                     const std::string& kind = "") {
  ReferenceOptions o;
  o.precision = precision;
  return bridge_internal::KeyHash(k, o, timed, kind);
}

TEST(ReferenceKeyTest, HighestAndKernelBenchKeepTheKeysOfExistingEntries) {
  const bridge_internal::KeyFacts k = GpuKeyFacts();
  // The key as it was before contracts timed their own baselines (length-prefixed fields).
  auto field = [](const std::string& name, const std::string& value) {
    return name + ":" + std::to_string(value.size()) + ":" + value + "\n";
  };
  const std::string before = "kernelsearch-reference-v1\n" + field("problem", k.problem_bytes) + field("sets", "3") +
                             field("seed", "42") + field("device", k.device_kind) + field("bridge", k.bridge_bytes) +
                             field("timing", k.timing_bytes) + field("transforms", k.transforms_bytes) +
                             field("torch", k.py.torch_version) + field("timed", "1");
  EXPECT_EQ(KeyUnder(k, "highest"), Sha256Hex(before).substr(0, 32));
  for (const char* same : {"kernelbench", "fp32"}) EXPECT_EQ(KeyUnder(k, same), KeyUnder(k, "highest")) << same;
}

TEST(ReferenceKeyTest, HighAndMediumTimedOnAGpuAreEntriesOfTheirOwn) {
  bridge_internal::KeyFacts k = GpuKeyFacts();
  EXPECT_NE(KeyUnder(k, "high"), KeyUnder(k, "highest"));
  EXPECT_NE(KeyUnder(k, "medium"), KeyUnder(k, "highest"));
  EXPECT_NE(KeyUnder(k, "medium"), KeyUnder(k, "high"));
  EXPECT_EQ(KeyUnder(k, "tf32"), KeyUnder(k, "high"));  // the alias is the contract
  // A resident reference's cached timings too.
  EXPECT_NE(KeyUnder(k, "high", true, "resident timing"), KeyUnder(k, "highest", true, "resident timing"));
  // Untimed, or on the CPU (never timed), the entry is the same: truth and bounds do not depend on it.
  EXPECT_EQ(KeyUnder(k, "high", false), KeyUnder(k, "highest", false));
  k.on_cuda = false;
  k.device_kind = "cpu";
  EXPECT_EQ(KeyUnder(k, "medium"), KeyUnder(k, "highest"));
}

// A resident reference whose manifest is cached: its timings and signature
// come from it (no --time, --signature-from the manifest); without one the
// bridge times and infers the shapes itself.
TEST(ReferenceKeyTest, ACachedResidentManifestGivesTheBridgeItsSignature) {
  ReferenceOptions o;
  o.time = true;
  auto has = [](const std::vector<std::string>& args, const std::string& a) {
    return std::find(args.begin(), args.end(), a) != args.end();
  };
  const auto cached = bridge_internal::ReferenceArgs("p.py", o, true, uint64_t{1} << 30, true, "/c/m.json");
  auto it = std::find(cached.begin(), cached.end(), "--signature-from");
  ASSERT_NE(it, cached.end());
  ASSERT_NE(it + 1, cached.end());
  EXPECT_EQ(*(it + 1), "/c/m.json");
  EXPECT_FALSE(has(cached, "--time"));
  const auto fresh = bridge_internal::ReferenceArgs("p.py", o, true, uint64_t{1} << 30, true, "");
  EXPECT_FALSE(has(fresh, "--signature-from"));
  EXPECT_TRUE(has(fresh, "--time"));
}

TEST(ReferenceKeyTest, TheBridgeIsToldTheLevelWhenItTimesOnAGpu) {
  auto level = [](const std::string& precision, bool time, bool on_cuda, bool may_stay) {
    ReferenceOptions o;
    o.precision = precision;
    o.time = time;
    const std::vector<std::string> args =
        bridge_internal::ReferenceArgs("p.py", o, on_cuda, uint64_t{1} << 30, may_stay, /*cached_manifest=*/"");
    auto it = std::find(args.begin(), args.end(), "--precision");
    return it == args.end() ? std::string("absent") : it + 1 == args.end() ? std::string("no value") : *(it + 1);
  };
  for (bool may_stay : {false, true}) {
    EXPECT_EQ(level("high", true, true, may_stay), "high");
    EXPECT_EQ(level("tf32", true, true, may_stay), "high");
    EXPECT_EQ(level("medium", true, true, may_stay), "medium");
    for (const char* defaults : {"highest", "kernelbench", "fp32"})
      EXPECT_EQ(level(defaults, true, true, may_stay), "absent") << defaults;
    EXPECT_EQ(level("high", false, true, may_stay), "absent");  // not timed
  }
  EXPECT_EQ(level("high", true, false, false), "absent");  // the CPU: never timed
}

TEST(ReferenceKeyTest, TheManifestSaysWhatTheBaselinesWereTimedUnder) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string());
  o.precision = "high";
  auto d = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->timing_precision, "default");  // the CPU: not timed
  auto text = ReadFile(d->dir + "/manifest.json");
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  j["timing_precision"] = "high";
  auto high = bridge_internal::ReferenceFromManifest(j, "manifest");
  ASSERT_TRUE(high.ok()) << high.status().message();
  EXPECT_EQ(high->timing_precision, "high");
  j.erase("timing_precision");  // a manifest from before
  auto old = bridge_internal::ReferenceFromManifest(j, "manifest");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->timing_precision, "");
}

}  // namespace
}  // namespace ks
