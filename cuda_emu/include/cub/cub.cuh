// Emulated cub/cub.cuh (cuda_emu): forwards to the one CUB algorithm the emulator
// provides, cub::DeviceRadixSort (cub/device/device_radix_sort.cuh). Declarations only.
#pragma once

#include "cub/device/device_radix_sort.cuh"
