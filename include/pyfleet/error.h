// Two error tiers (docs/development.md, "C++"): a broken internal invariant aborts with
// file:line; a caller's mistake throws, and the binding turns it into
// ValueError (std::invalid_argument) or RuntimeError (std::runtime_error).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

#define PYFLEET_ASSERT(cond)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "pyfleet: internal invariant failed at %s:%d: %s\n", \
                   __FILE__, __LINE__, #cond);                                 \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace pyfleet {

// Builds a message from streamable parts: Msg("dim ", d, " != ", e).
template <typename... Parts>
std::string Msg(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// A caller's bad argument: reaches Python as ValueError.
template <typename... Parts>
[[noreturn]] void ThrowInvalid(const Parts&... parts) {
  throw std::invalid_argument(Msg(parts...));
}

// A failure of the environment (I/O, a damaged file): RuntimeError.
template <typename... Parts>
[[noreturn]] void ThrowRuntime(const Parts&... parts) {
  throw std::runtime_error(Msg(parts...));
}

}  // namespace pyfleet
