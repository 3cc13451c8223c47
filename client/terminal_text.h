// Text from the daemon (job names, paths, errors, log lines) reaches a terminal only through Printable: control
// characters (ESC and the other C0 and C1 codes, DEL) and bidirectional overrides are shown escaped (\x1b, \u202e),
// so a job name or a dataset's error text cannot retitle the window, clear the screen or reorder what is shown.
#pragma once

#include <string>
#include <string_view>

namespace slidectl {

// `keep_newlines` keeps '\n' and '\t' (multi-line log text); invalid UTF-8 bytes are escaped as \xNN.
std::string Printable(std::string_view text, bool keep_newlines = false);

}  // namespace slidectl
