// weft's device API: symmetric pointers, put/get, signals, fence/quiet, barrier.
// The same source runs in CUDA kernels and on the host backend's worker threads.
#pragma once
#include "weft/device/atomics.hpp"
#include "weft/device/barrier.hpp"
#include "weft/device/coop.hpp"
#include "weft/device/ctx.hpp"
#include "weft/device/p2p.hpp"
#include "weft/device/signal.hpp"
