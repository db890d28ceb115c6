// See ../context.h: ProcessGroupGloo holds devices and buffers through shared_ptr / unique_ptr only.
#pragma once

namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
