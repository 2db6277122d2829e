// A slot key names the place of a stored step in a search: every model call,
// idea and candidate is stored under one, and a resumed search finds the step
// again by it, so that each write is idempotent. The strings are in the
// databases of earlier versions, which must resume: Format() never changes
// them, and tests/search/slot_key_test.cc pins each form.
//   r<R>/p<P>             the ideas call of round R for parent candidate P
//   r<R>/p<P>/i<N>        the N-th idea of that call's reply
//   r<R>/first            the first idea of round R (a round without parents)
//   r<R>/seed             the seed kernel's idea (round 0)
//   r<R>/seed/b<B>        the seed kernel
//   r<R>/i<I>/b<B>        branch B of the implementation of idea I (by id)
//   r<R>/i<I>/b<B>/t<T>   turn T of an agent's implementation (search/agent.h)
//   repair/c<C>           the repair of failed candidate C
// A value type; thread-safe as any struct.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ks {

struct SlotKey {
  enum class Kind { kIdeas, kIdea, kFirstIdea, kSeedIdea, kSeed, kImplement, kAgentTurn, kRepair };

  static SlotKey Ideas(int round, int64_t parent);
  static SlotKey FirstIdea(int round);
  static SlotKey SeedIdea();
  static SlotKey Seed();
  static SlotKey Implement(int round, int64_t idea, int branch);
  static SlotKey Repair(int64_t failed_candidate);
  // The index-th idea of this ideas call's reply (kind kIdeas).
  SlotKey IdeaAt(int index) const;
  // Turn `turn` of an agent implementing this slot (kind kImplement).
  SlotKey Turn(int turn) const;

  // The stored string, byte for byte as earlier versions wrote it.
  std::string Format() const;
  // The key a stored string names; InvalidArgument when it is none of the forms.
  // Parse(s)->Format() == s for every string Parse accepts.
  static StatusOr<SlotKey> Parse(std::string_view text);

  // The round it belongs to; nullopt for a repair (its round is its candidate's).
  std::optional<int> Round() const;

  bool operator==(const SlotKey&) const = default;

  Kind kind = Kind::kImplement;
  int round = 0;           // every kind but kRepair
  int64_t parent = 0;      // kIdeas, kIdea: the parent candidate's id
  int index = 0;           // kIdea: its place in the reply
  int64_t idea = 0;        // kImplement, kAgentTurn: the idea's id
  int branch = 0;          // kSeed, kImplement, kAgentTurn
  int turn = 0;            // kAgentTurn
  int64_t candidate = 0;   // kRepair: the failed candidate's id
};

}  // namespace ks
