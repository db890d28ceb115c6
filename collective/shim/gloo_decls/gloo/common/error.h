// See ../context.h: ProcessGroupGloo.hpp includes this header but names nothing declared in it.
#pragma once
