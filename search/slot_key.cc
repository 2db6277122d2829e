#include "search/slot_key.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

namespace ks {
namespace {

// A broken invariant of our own code (a turn of an ideas call): abort loudly.
void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "SlotKey: %s\n", what);
  std::abort();
}

std::vector<std::string_view> Split(std::string_view text) {
  std::vector<std::string_view> out;
  for (;;) {
    size_t slash = text.find('/');
    out.push_back(text.substr(0, slash));
    if (slash == std::string_view::npos) return out;
    text.remove_prefix(slash + 1);
  }
}

// `token` is `prefix` and a decimal number as Format() writes it (no sign, no
// leading zeros), so that every parsed key formats back to the same string.
template <typename T>
bool Number(std::string_view token, char prefix, T* out) {
  if (token.size() < 2 || token[0] != prefix) return false;
  std::string_view digits = token.substr(1);
  if (digits[0] < '0' || digits[0] > '9' || (digits[0] == '0' && digits.size() > 1)) return false;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *out);
  return ec == std::errc() && end == digits.data() + digits.size();
}

}  // namespace

SlotKey SlotKey::Ideas(int round, int64_t parent) { return {.kind = Kind::kIdeas, .round = round, .parent = parent}; }
SlotKey SlotKey::FirstIdea(int round) { return {.kind = Kind::kFirstIdea, .round = round}; }
SlotKey SlotKey::SeedIdea() { return {.kind = Kind::kSeedIdea, .round = 0}; }
SlotKey SlotKey::Seed() { return {.kind = Kind::kSeed, .round = 0, .branch = 0}; }
SlotKey SlotKey::Implement(int round, int64_t idea, int branch) {
  return {.kind = Kind::kImplement, .round = round, .idea = idea, .branch = branch};
}
SlotKey SlotKey::Repair(int64_t failed_candidate) { return {.kind = Kind::kRepair, .candidate = failed_candidate}; }

SlotKey SlotKey::IdeaAt(int i) const {
  Require(kind == Kind::kIdeas, "IdeaAt of a slot that is no ideas call");
  SlotKey k = *this;
  k.kind = Kind::kIdea;
  k.index = i;
  return k;
}

SlotKey SlotKey::Turn(int t) const {
  Require(kind == Kind::kImplement, "Turn of a slot that is no implementation");
  SlotKey k = *this;
  k.kind = Kind::kAgentTurn;
  k.turn = t;
  return k;
}

std::string SlotKey::Format() const {
  switch (kind) {
    case Kind::kIdeas: return fmt::format("r{}/p{}", round, parent);
    case Kind::kIdea: return fmt::format("r{}/p{}/i{}", round, parent, index);
    case Kind::kFirstIdea: return fmt::format("r{}/first", round);
    case Kind::kSeedIdea: return fmt::format("r{}/seed", round);
    case Kind::kSeed: return fmt::format("r{}/seed/b{}", round, branch);
    case Kind::kImplement: return fmt::format("r{}/i{}/b{}", round, idea, branch);
    case Kind::kAgentTurn: return fmt::format("r{}/i{}/b{}/t{}", round, idea, branch, turn);
    case Kind::kRepair: return fmt::format("repair/c{}", candidate);
  }
  Require(false, "unknown kind");
  return "";
}

StatusOr<SlotKey> SlotKey::Parse(std::string_view text) {
  std::vector<std::string_view> t = Split(text);
  SlotKey k;
  auto is = [&](size_t n) { return t.size() == n; };
  if (is(2) && t[0] == "repair" && Number(t[1], 'c', &k.candidate)) {
    k.kind = Kind::kRepair;
    return k;
  }
  if (t.size() >= 2 && Number(t[0], 'r', &k.round)) {
    if (is(2) && t[1] == "first") return FirstIdea(k.round);
    if (is(2) && t[1] == "seed") return SlotKey{.kind = Kind::kSeedIdea, .round = k.round};
    if (is(3) && t[1] == "seed" && Number(t[2], 'b', &k.branch)) {
      k.kind = Kind::kSeed;
      return k;
    }
    if (Number(t[1], 'p', &k.parent)) {
      if (is(2)) return Ideas(k.round, k.parent);
      if (is(3) && Number(t[2], 'i', &k.index)) return Ideas(k.round, k.parent).IdeaAt(k.index);
    }
    if ((is(3) || is(4)) && Number(t[1], 'i', &k.idea) && Number(t[2], 'b', &k.branch)) {
      SlotKey impl = Implement(k.round, k.idea, k.branch);
      if (is(3)) return impl;
      if (Number(t[3], 't', &k.turn)) return impl.Turn(k.turn);
    }
  }
  return InvalidArgument(fmt::format("'{}' is not a slot key (search/slot_key.h lists the forms)", text));
}

std::optional<int> SlotKey::Round() const {
  if (kind == Kind::kRepair) return std::nullopt;
  return round;
}

}  // namespace ks
