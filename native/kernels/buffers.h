// Scratch buffers of the CPU kernels (sizes rounded to a block, arrays at a cache-line boundary)
// and the split of their work among threads.
#pragma once

#include <algorithm>
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

// This thread's run [i0, i1) of units x parts work items: each of `units` (heads, column
// blocks) cut into `parts` ranges (of at most max_parts), as many as give every thread two
// items when there are fewer units than that; thread ith of nth takes an equal share in order.
struct WorkSplit {
    int64_t parts, i0, i1;
};

inline WorkSplit split_work(int64_t units, int64_t max_parts, int ith, int nth) {
    const int64_t parts = std::clamp<int64_t>((2 * nth + units - 1) / units, 1, max_parts);
    const int64_t items = units * parts;
    return {parts, items * ith / nth, items * (ith + 1) / nth};
}

}  // namespace sdplan::kernels
