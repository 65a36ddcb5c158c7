// TextStream: the streamed pieces add up to the decoded text, never show part of a stop string or of
// a UTF-8 character, and end just before the first stop string (planted:
// held_back() returning 0: caught by four of them).
#include <gtest/gtest.h>

#include "megaton/data/tokenizer.h"
#include "megaton/core/error.h"
#include "megaton/infer/text_stream.h"

using namespace megaton;

namespace {

struct Streamed {
  std::vector<std::string> pieces;
  std::string all;
  bool stopped;
};

// Feeds `text` byte by byte (the byte tokenizer's ids are the bytes).
Streamed stream_bytes(const std::string& text, std::vector<std::string> stops) {
  const auto tok = data::make_tokenizer("byte");
  infer::TextStream s(*tok, std::move(stops));
  Streamed r;
  for (unsigned char c : text) {
    r.pieces.push_back(s.push(c));
    r.all += r.pieces.back();
  }
  r.all += s.finish();
  r.stopped = s.stopped();
  EXPECT_EQ(r.all, s.text());
  return r;
}

}  // namespace

TEST(TextStream, WithoutStopsEveryByteIsReleasedInOrder) {
  const auto r = stream_bytes("hello world", {});
  EXPECT_EQ(r.all, "hello world");
  EXPECT_FALSE(r.stopped);
  for (const auto& p : r.pieces) EXPECT_EQ(p.size(), 1u);  // nothing held back: no stop can start anywhere
}

TEST(TextStream, EndsBeforeTheFirstStopStringAndHoldsBackItsPrefix) {
  const auto r = stream_bytes("abcXYZdefXYZ", {"XYZ"});
  EXPECT_EQ(r.all, "abc");
  EXPECT_TRUE(r.stopped);
  // After "abcX" and "abcXY" nothing new may show: the X could begin the stop string.
  EXPECT_EQ(r.pieces[3], "");
  EXPECT_EQ(r.pieces[4], "");
  // A prefix that does not complete is released once it cannot be a stop any more.
  const auto q = stream_bytes("abXYdXYZ", {"XYZ"});
  EXPECT_EQ(q.all, "abXYd");
  EXPECT_EQ(q.pieces[4], "XYd");
}

TEST(TextStream, TheEarliestOfSeveralStopsWins) {
  EXPECT_EQ(stream_bytes("one two three", {"three", "two"}).all, "one ");
  EXPECT_EQ(stream_bytes("stop at the end", {"end", "d"}).all, "stop at the ");
}

TEST(TextStream, AStopStringAtTheVeryStartLeavesNothing) {
  const auto r = stream_bytes("\n<|user|>", {"\n<|"});
  EXPECT_EQ(r.all, "");
  EXPECT_TRUE(r.stopped);
}

TEST(TextStream, HoldsBackAnUnfinishedUtf8Character) {
  const std::string euro = "\xE2\x82\xAC";  // one character, three bytes
  const auto r = stream_bytes("a" + euro + "b", {});
  EXPECT_EQ(r.pieces[1], "");
  EXPECT_EQ(r.pieces[2], "");
  EXPECT_EQ(r.pieces[3], euro);
  EXPECT_EQ(r.all, "a" + euro + "b");
  // Cut short inside the character: finish() still hands over what was generated.
  EXPECT_EQ(stream_bytes("a\xE2\x82", {}).all, "a\xE2\x82");
}

TEST(TextStream, EmptyStopStringsAreRefused) {
  const auto tok = data::make_tokenizer("byte");
  EXPECT_THROW(infer::TextStream(*tok, {""}), megaton::Error);
}
