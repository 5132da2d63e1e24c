// The Python module object of specpilot._C. Ops register themselves per family in the other
// files of this folder (TORCH_LIBRARY_FRAGMENT(specpilot, ...)); this file only reports how the
// extension was built, for `specpilot env`.
#include <torch/extension.h>

#include <string>

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
#ifdef SPECPILOT_WITH_CUDA
  info["with_cuda"] = true;
#else
  info["with_cuda"] = false;
#endif
#if defined(__clang__)
  info["cxx"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  info["cxx"] = std::string("gcc ") + __VERSION__;
#else
  info["cxx"] = std::string("unknown");
#endif
  info["torch_abi"] = std::to_string(_GLIBCXX_USE_CXX11_ABI);
  return info;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specpilot native ops (registered under torch.ops.specpilot)";
  m.def("build_info", &build_info, "How this extension was built");
}
