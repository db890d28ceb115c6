// Flotilla's declarations of the few gloo types that libtorch's ProcessGroupGloo.hpp names. The torch wheel ships
// libgloo inside libtorch_cpu.so but not gloo's headers. ProcessGroupGloo holds every gloo object behind a
// pointer, so the shim needs these types declared, never their layout: it constructs no gloo object and calls no
// gloo function itself (see ARCHITECTURE.md, "collective"). Only the members that inline code in
// ProcessGroupGloo.hpp names are declared.
#pragma once
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
