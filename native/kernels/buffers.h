// Scratch buffers of the CPU kernels: sizes rounded to a block, arrays at a cache-line boundary.
#pragma once

#include <cstdint>
#include <vector>

namespace sdplan::kernels {

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// n elements of T in buf, starting at a 64-byte boundary (buf grows as needed).
template <typename T>
T *aligned(std::vector<char> &buf, size_t n) {
    buf.resize(n * sizeof(T) + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<T *>(buf.data() + (64 - p % 64) % 64);
}

}  // namespace sdplan::kernels
