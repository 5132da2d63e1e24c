// SP_CHECK(cond, parts...): TORCH_CHECK with its message built from std::string and std::to_string
// alone, never through std::ostream. On the H200 image (torch 2.11 built with gcc-toolset-13, this
// extension with Ubuntu's gcc 13.3) an std::ostringstream used inside this extension crashes
// (SIGSEGV in the stream insertion; native backtrace in docs/PERF_NOTES.md, 2026-12-03 fourth
// session), and TORCH_CHECK formats a message of several parts through one. A single std::string
// goes through TORCH_CHECK untouched. Every binding checks its arguments with SP_CHECK.
#pragma once

#include <torch/extension.h>

#include <cstdio>
#include <string>
#include <type_traits>

namespace specpilot {
namespace check {

inline std::string text(const char* s) { return s; }
inline std::string text(const std::string& s) { return s; }
inline std::string text(c10::ScalarType t) { return c10::toString(t); }
inline std::string text(const c10::Device& d) { return d.str(); }  // formatted inside libc10

inline std::string text(at::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

inline std::string text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string text(T v) {
  return std::to_string(v);
}

template <class... Parts>
std::string message(const Parts&... parts) {
  std::string s;
  ((s += text(parts)), ...);
  return s;
}

}  // namespace check
}  // namespace specpilot

#define SP_CHECK(cond, ...) TORCH_CHECK(cond, ::specpilot::check::message(__VA_ARGS__))
