// What slidectl prints of the daemon's text: control characters and bidirectional overrides escaped, the rest
// (UTF-8 included) as it is.
#include "client/terminal_text.h"

#include <gtest/gtest.h>

namespace {

using slidectl::Printable;

TEST(TerminalText, ControlSequencesAreShownEscaped) {
  EXPECT_EQ(Printable("plain text, ünïcödé ✓"), "plain text, ünïcödé ✓");
  EXPECT_EQ(Printable("\x1b]0;pwned\x07title"), "\\x1b]0;pwned\\x07title");  // window title (OSC)
  EXPECT_EQ(Printable("a\x1b[2J\x1b[Hb"), "a\\x1b[2J\\x1b[Hb");              // clear screen
  EXPECT_EQ(Printable("x\ry"), "x\\x0dy");                                   // overwrite the line
  EXPECT_EQ(Printable("del\x7f"), "del\\x7f");
  EXPECT_EQ(Printable("c1 \xc2\x9b"
                      "31m"),
            "c1 \\x9b31m");  // the one-byte CSI
  EXPECT_EQ(Printable("rtl \xe2\x80\xae"
                      "gnp.exe"),
            "rtl \\u202egnp.exe");  // right-to-left override
  EXPECT_EQ(Printable("bad \xff byte"), "bad \\xff byte");
  EXPECT_EQ(Printable("two\nlines\tand tab"), "two\\x0alines\\x09and tab");
  EXPECT_EQ(Printable("two\nlines\tand tab", /*keep_newlines=*/true), "two\nlines\tand tab");
  EXPECT_EQ(Printable("keep\n\x1b[31mred", true), "keep\n\\x1b[31mred");
}

}  // namespace
