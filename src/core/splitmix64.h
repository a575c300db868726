// splitmix64 (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number generators"): the one copy the
// project's seeded generators and hashes share, on the host and (compiled by nvcc) on the device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EPI_HOST_DEVICE __host__ __device__
#else
#define EPI_HOST_DEVICE
#endif

namespace epinfer {

// The generator's increment (2^64 / φ, odd).
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// splitmix64's output function: a bijection of 64-bit words that mixes every input bit into every output bit.
EPI_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The next value of the generator whose state is `state` (advanced).
EPI_HOST_DEVICE inline uint64_t splitmix64(uint64_t& state) {
    return mix64(state += kSplitMix64Gamma);
}

}  // namespace epinfer
