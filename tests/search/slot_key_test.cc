// Slot keys (search/slot_key.h): the exact strings earlier versions stored,
// so that their databases resume, and Parse as Format's inverse.

#include "search/slot_key.h"

#include <gtest/gtest.h>

namespace ks {
namespace {

struct Form {
  SlotKey key;
  const char* text;  // as stored by the versions before SlotKey
};

const Form kForms[] = {
    {SlotKey::Ideas(2, 17), "r2/p17"},
    {SlotKey::Ideas(2, 17).IdeaAt(0), "r2/p17/i0"},
    {SlotKey::FirstIdea(3), "r3/first"},
    {SlotKey::SeedIdea(), "r0/seed"},
    {SlotKey::Seed(), "r0/seed/b0"},
    {SlotKey::Implement(0, 3, 1), "r0/i3/b1"},
    {SlotKey::Implement(12, 4567, 0).Turn(10), "r12/i4567/b0/t10"},
    {SlotKey::Repair(88), "repair/c88"},
    {SlotKey::Implement(0, 9000000000, 2), "r0/i9000000000/b2"},
};

TEST(SlotKey, EveryFormFormatsAsEarlierVersionsStoredIt) {
  for (const Form& f : kForms) EXPECT_EQ(f.key.Format(), f.text);
}

TEST(SlotKey, EveryFormRoundTrips) {
  for (const Form& f : kForms) {
    auto parsed = SlotKey::Parse(f.text);
    ASSERT_TRUE(parsed.ok()) << f.text << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, f.key) << f.text;
    EXPECT_EQ(parsed->Format(), f.text);
  }
}

TEST(SlotKey, FieldsOfParsedKeys) {
  auto turn = SlotKey::Parse("r1/i5/b2/t3");
  ASSERT_TRUE(turn.ok());
  EXPECT_EQ(turn->kind, SlotKey::Kind::kAgentTurn);
  EXPECT_EQ(turn->round, 1);
  EXPECT_EQ(turn->idea, 5);
  EXPECT_EQ(turn->branch, 2);
  EXPECT_EQ(turn->turn, 3);
  EXPECT_EQ(turn->Round(), 1);
  auto repair = SlotKey::Parse("repair/c7");
  ASSERT_TRUE(repair.ok());
  EXPECT_EQ(repair->candidate, 7);
  EXPECT_EQ(repair->Round(), std::nullopt);
  auto idea = SlotKey::Parse("r4/p9/i2");
  ASSERT_TRUE(idea.ok());
  EXPECT_EQ(idea->kind, SlotKey::Kind::kIdea);
  EXPECT_EQ(idea->parent, 9);
  EXPECT_EQ(idea->index, 2);
}

// Strings that are no key (or would not format back to themselves) are errors.
TEST(SlotKey, OtherStringsAreErrors) {
  for (const char* bad : {"", "r", "r1", "r/p1", "r-1/p2", "r+1/p2", "r01/p2", "r1/p", "r1/p2/", "r1/p2/i",
                          "r1/p2/b3", "r1/i2", "r1/i2/b3/t", "r1/i2/b3/t4/t5", "r1/seed/b", "r1/first/b0",
                          "repair", "repair/c", "repair/c1/t0", "repair/r1", "x1/p2", "r1/p2 ", " r1/p2",
                          "r99999999999/p1", "r1/i2/b3/x4"}) {
    auto parsed = SlotKey::Parse(bad);
    if (parsed.ok()) {
      ADD_FAILURE() << "'" << bad << "' parsed as " << parsed->Format();
      continue;
    }
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ks
