// Weight stores: named tensors of a model file, allocated on demand into backend buffers
// (whole sets or subsets: a block range, a segment), filled with large sequential reads
// straight from the file (pread into a staging buffer, then ggml_backend_tensor_set),
// converting dtypes on the way, and copied between stores for staging. On the CPU, tensors
// held in their file dtype are instead mapped from the file (copy-on-write, pages populated
// from the page cache at once): no copy, and the page cache is the only copy in RAM.
#include "tensor.h"
#include "kernels/bf16_gemm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sdplan {

namespace {

struct WeightStore;

// Tensors of one store placed in one backend buffer.
// Owned by its store (kept until free() or the store goes) and shared with Python.
struct WeightBuffer {
    std::shared_ptr<Context> ctx;  // keeps the tensors' metadata alive
    ggml_backend_buffer_t buf = nullptr;
    std::vector<ggml_tensor *> tensors;
    std::string device;
    size_t size = 0;
    void *map_addr = nullptr;  // a file mapping the buffer points into (map_items), or none
    size_t map_len = 0;

    ~WeightBuffer() { release(); }
    void release() {
        if (!buf) return;
        for (ggml_tensor *t : tensors) {
            t->buffer = nullptr;
            t->data = nullptr;
        }
        ggml_backend_buffer_free(buf);
        buf = nullptr;
        if (map_addr) ::munmap(map_addr, map_len);
        map_addr = nullptr;
        weight_epoch.fetch_add(1);
    }
};

struct WeightStore : std::enable_shared_from_this<WeightStore> {
    std::shared_ptr<Context> ctx;
    std::map<std::string, ggml_tensor *> by_name;
    std::map<ggml_tensor *, int> ndim;
    std::map<ggml_tensor *, ggml_backend_buffer_type_t> planned;
    std::vector<std::shared_ptr<WeightBuffer>> buffers;

    // Hold a new buffer of this store's tensors (dropping freed ones).
    void keep(const std::shared_ptr<WeightBuffer> &wb) {
        buffers.erase(std::remove_if(buffers.begin(), buffers.end(), [](auto &b) { return b->buf == nullptr; }),
                      buffers.end());
        buffers.push_back(wb);
    }

    ggml_tensor *get(const std::string &name) const {
        auto it = by_name.find(name);
        if (it == by_name.end()) throw nb::key_error(("WeightStore: no tensor named '" + name + "'").c_str());
        return it->second;
    }
    Tensor tensor(const std::string &name) {
        ggml_tensor *t = get(name);
        Tensor x;
        x.t = t;
        x.ndim = ndim[t];
        x.owner = shared_from_this();
        x.weight = true;
        auto p = planned.find(t);
        if (p != planned.end()) x.planned_buft = p->second;
        return x;
    }
};

std::shared_ptr<WeightStore> make_store(const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> &specs) {
    auto s = std::make_shared<WeightStore>();
    // the context forgets its tensors' long names when it goes (after the last buffer)
    s->ctx = std::shared_ptr<Context>(new Context(ggml_tensor_overhead() * (specs.size() + 1) + 1024), [](Context *c) {
        std::vector<ggml_tensor *> ts;
        for (ggml_tensor *t = ggml_get_first_tensor(c->ctx); t; t = ggml_get_next_tensor(c->ctx, t)) ts.push_back(t);
        forget_long_names(ts);
        delete c;
    });
    for (auto &[name, dtype, shape] : specs) {
        if (name.empty()) throw nb::value_error("WeightStore: tensor names must not be empty");
        if (s->by_name.count(name)) throw nb::value_error(("WeightStore: duplicate tensor '" + name + "'").c_str());
        ggml_type type = dtype_from_name(dtype, ("WeightStore: tensor '" + name + "'").c_str());
        int64_t ne[4];
        shape_to_ne(shape, ne, ("WeightStore: tensor '" + name + "'").c_str());
        if (ne[0] % ggml_blck_size(type))
            throw nb::value_error(("WeightStore: tensor '" + name + "': row length " + std::to_string(ne[0]) +
                                   " is not a multiple of the " + dtype + " block size").c_str());
        ggml_tensor *t = ggml_new_tensor_4d(s->ctx->ctx, type, ne[0], ne[1], ne[2], ne[3]);
        set_long_name(t, name);
        s->by_name[name] = t;
        s->ndim[t] = (int)shape.size();
    }
    return s;
}

size_t padded(size_t n, size_t align) { return (n + align - 1) / align * align; }

std::shared_ptr<WeightBuffer> allocate(std::shared_ptr<WeightStore> store, const std::vector<std::string> &names,
                                       std::shared_ptr<Backend> backend) {
    if (!backend) throw nb::value_error("WeightStore.allocate: backend is None");
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(backend->get());
    const size_t align = ggml_backend_buft_get_alignment(buft);
    auto wb = std::make_shared<WeightBuffer>();
    wb->ctx = store->ctx;
    wb->device = backend->device_name;
    size_t total = 0;
    for (auto &n : names) {
        ggml_tensor *t = store->get(n);
        if (t->buffer) throw nb::value_error(("WeightStore.allocate: tensor '" + n + "' is already allocated").c_str());
        if (std::find(wb->tensors.begin(), wb->tensors.end(), t) != wb->tensors.end()) continue;
        wb->tensors.push_back(t);
        total += padded(ggml_backend_buft_get_alloc_size(buft, t), align);
    }
    if (wb->tensors.empty()) return wb;
    {
        nb::gil_scoped_release nogil;
        wb->buf = ggml_backend_buft_alloc_buffer(buft, total + align);
    }
    if (!wb->buf)
        throw std::runtime_error("WeightStore.allocate: could not allocate " + std::to_string(total) + " bytes on " +
                                 backend->device_name + " (out of device memory?)");
    ggml_backend_buffer_set_usage(wb->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    wb->size = ggml_backend_buffer_get_size(wb->buf);
    ggml_tallocr talloc = ggml_tallocr_new(wb->buf);
    for (ggml_tensor *t : wb->tensors) {
        if (ggml_tallocr_alloc(&talloc, t) != GGML_STATUS_SUCCESS) {
            wb->release();
            throw std::runtime_error("WeightStore.allocate: tensor placement failed");
        }
    }
    store->keep(wb);
    return wb;
}

#if defined(__GNUC__) && defined(__x86_64__)
// f16 -> bf16 (nearest even, as ggml_fp32_to_bf16_row; f16 -> f32 is exact) 32 values per step,
// on CPUs that run a bf16 kernel (AVX512F, AVX512BW, AVX512_BF16): the bf16 weights' load.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void f16_to_bf16_avx512(const uint16_t *s,
                                                                                       uint16_t *d, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const int64_t left = n - i;
        const __mmask16 lo = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __mmask16 hi = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
        const __m512 a = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lo, s + i));
        const __m512 b = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(hi, s + i + 16));
        const __mmask32 m = left >= 32 ? 0xffffffffu : (__mmask32)((1ull << left) - 1);
        _mm512_mask_storeu_epi16(d + i, m, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}
#define SDPLAN_F16_TO_BF16 1
#endif

// Convert `nrows` rows of `src_type` into `dst_type`; `f32` is scratch of nrows*ne0 floats.
void convert_rows(const void *src, ggml_type src_type, void *dst, ggml_type dst_type, int64_t nrows, int64_t ne0,
                  std::vector<float> &f32) {
    const int64_t n = nrows * ne0;
#ifdef SDPLAN_F16_TO_BF16
    if (src_type == GGML_TYPE_F16 && dst_type == GGML_TYPE_BF16 && bf16_cpu_kernel() != Bf16Kernel::none) {
        f16_to_bf16_avx512(static_cast<const uint16_t *>(src), static_cast<uint16_t *>(dst), n);
        return;
    }
#endif
    const float *mid;
    if (src_type == GGML_TYPE_F32) {
        mid = static_cast<const float *>(src);
    } else {
        f32.resize((size_t)n);
        const auto *traits = ggml_get_type_traits(src_type);
        if (!traits->to_float) throw std::runtime_error("no conversion from " + dtype_name(src_type));
        traits->to_float(src, f32.data(), n);
        mid = f32.data();
    }
    switch (dst_type) {
        case GGML_TYPE_F32: std::memcpy(dst, mid, (size_t)n * sizeof(float)); break;
        case GGML_TYPE_F16: ggml_fp32_to_fp16_row(mid, static_cast<ggml_fp16_t *>(dst), n); break;
        case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(mid, static_cast<ggml_bf16_t *>(dst), n); break;
        default:
            if (!ggml_is_quantized(dst_type)) throw std::runtime_error("no conversion to " + dtype_name(dst_type));
            ggml_quantize_chunk(dst_type, mid, dst, 0, nrows, ne0, nullptr);
    }
}

void pread_all(int fd, void *dst, size_t n, uint64_t off, const std::string &path) {
    char *p = static_cast<char *>(dst);
    while (n > 0) {
        ssize_t r = ::pread(fd, p, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            throw std::runtime_error(path + ": read failed: " + std::strerror(errno));
        }
        if (r == 0) throw std::runtime_error(path + ": file ends before offset " + std::to_string(off + n));
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
}

struct ReadItem {
    ggml_tensor *t;
    uint64_t offset;
    ggml_type file_type;
};

// Rows [r0, r0 + nr) of one item: the unit of work of a threaded host load.
struct RowSpan {
    const ReadItem *it;
    int64_t r0, nr;
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Fault in the whole pages inside [p, p + n) writable in one call (fresh memory: one call costs
// about 0.6x the page-by-page first touch of copying into it, measured on 2 GiB); a no-op where
// the kernel lacks MADV_POPULATE_WRITE or the pages are already there.
void populate_write(char *p, size_t n) {
    const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
    if (b > a) ::madvise(reinterpret_cast<void *>(a), b - a, MADV_POPULATE_WRITE);
}

// Each span is faulted in and filled in pieces of about this many bytes, so the pages the
// kernel has just zeroed are still in L2 when they are overwritten (one write to memory, not
// two; streaming stores after a whole span's populate measured slower).
constexpr size_t kSubBytes = 512 * 1024;

// Every item into a tensor in host memory, from a read-only mapping of the file, by `n_threads`
// threads taking spans of about `chunk` file bytes in turn: each span is copied or converted
// straight into its tensor (no staging copy), so the destination's page faults and the
// conversions run on every thread. Returns false when the file cannot be mapped (the caller
// reads instead); throws when the file is shorter than an item.
bool read_host_mapped(const std::string &path, const std::vector<ReadItem> &items, size_t chunk, int n_threads,
                      uint64_t &total) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        ::close(fd);
        return false;
    }
    uint64_t hi = 0;
    std::vector<RowSpan> spans;
    for (auto &it : items) {
        const int64_t ne0 = it.t->ne[0], nrows = ggml_nrows(it.t);
        const size_t in_row = ggml_row_size(it.file_type, ne0);
        hi = std::max<uint64_t>(hi, it.offset + in_row * (uint64_t)nrows);
        const int64_t per = std::max<int64_t>(1, (int64_t)(chunk / std::max<size_t>(in_row, 1)));
        for (int64_t r0 = 0; r0 < nrows; r0 += per) spans.push_back({&it, r0, std::min(per, nrows - r0)});
    }
    if ((uint64_t)st.st_size < hi) {
        ::close(fd);
        throw std::runtime_error(path + ": file ends before offset " + std::to_string(hi));
    }
    void *addr = ::mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (addr == MAP_FAILED) return false;
    ::madvise(addr, (size_t)st.st_size, MADV_SEQUENTIAL);
    const char *file = static_cast<const char *>(addr);
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> bytes{0};
    std::exception_ptr failed;
    std::mutex failed_mu;
    auto work = [&]() {
        std::vector<float> f32;
        try {
            for (size_t i; (i = next.fetch_add(1)) < spans.size();) {
                const RowSpan &sp = spans[i];
                ggml_tensor *t = sp.it->t;
                const int64_t ne0 = t->ne[0];
                const size_t in_row = ggml_row_size(sp.it->file_type, ne0), out_row = ggml_row_size(t->type, ne0);
                const char *src = file + sp.it->offset + in_row * (uint64_t)sp.r0;
                char *dst = static_cast<char *>(t->data) + out_row * (size_t)sp.r0;
                const int64_t sub = std::max<int64_t>(1, (int64_t)(kSubBytes / std::max<size_t>(out_row, 1)));
                for (int64_t r = 0; r < sp.nr; r += sub) {
                    const int64_t nr = std::min(sub, sp.nr - r);
                    char *d = dst + out_row * (size_t)r;
                    const char *sr = src + in_row * (size_t)r;
                    populate_write(d, out_row * (size_t)nr);
                    if (sp.it->file_type == t->type) std::memcpy(d, sr, in_row * (size_t)nr);
                    else convert_rows(sr, sp.it->file_type, d, t->type, nr, ne0, f32);
                }
                bytes.fetch_add(in_row * (uint64_t)sp.nr);
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(failed_mu);
            if (!failed) failed = std::current_exception();
            next.store(spans.size());
        }
    };
    std::vector<std::thread> pool;
    const int n = std::max(1, std::min<int>(n_threads, (int)spans.size()));
    for (int k = 1; k < n; ++k) pool.emplace_back(work);
    work();
    for (auto &th : pool) th.join();
    ::munmap(addr, (size_t)st.st_size);
    if (failed) std::rethrow_exception(failed);
    total += bytes.load();
    return true;
}

// Reads every item into its allocated tensor; returns file bytes read.
uint64_t read_items(const std::string &path, std::vector<ReadItem> items, size_t chunk, int n_threads) {
    std::sort(items.begin(), items.end(), [](const ReadItem &a, const ReadItem &b) { return a.offset < b.offset; });
    uint64_t total = 0;
    // tensors in host memory last: filled from a mapping of the file, on n_threads threads
    const auto host = std::stable_partition(items.begin(), items.end(), [](const ReadItem &it) {
        return !ggml_backend_buffer_is_host(it.t->buffer);
    });
    if (host != items.end() && read_host_mapped(path, {host, items.end()}, chunk, n_threads, total)) {
        items.erase(host, items.end());
        if (items.empty()) return total;
    }
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
#ifdef POSIX_FADV_SEQUENTIAL
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    std::vector<char> staging, out;
    std::vector<float> f32;
    try {
        for (auto &it : items) {
            ggml_tensor *t = it.t;
            const int64_t ne0 = t->ne[0], nrows = ggml_nrows(t);
            const size_t in_row = ggml_row_size(it.file_type, ne0), out_row = ggml_row_size(t->type, ne0);
            const bool host = ggml_backend_buffer_is_host(t->buffer);
            int64_t rows_per = std::max<int64_t>(1, (int64_t)(chunk / std::max<size_t>(in_row, 1)));
            if (it.file_type == t->type && host) {
                pread_all(fd, t->data, in_row * (size_t)nrows, it.offset, path);  // straight into RAM
                total += in_row * (size_t)nrows;
                continue;
            }
            for (int64_t r0 = 0; r0 < nrows; r0 += rows_per) {
                const int64_t nr = std::min(rows_per, nrows - r0);
                staging.resize(in_row * (size_t)nr);
                pread_all(fd, staging.data(), staging.size(), it.offset + in_row * (uint64_t)r0, path);
                total += staging.size();
                const void *src = staging.data();
                if (it.file_type != t->type) {
                    out.resize(out_row * (size_t)nr);
                    convert_rows(staging.data(), it.file_type, out.data(), t->type, nr, ne0, f32);
                    src = out.data();
                }
                ggml_backend_tensor_set(t, src, out_row * (size_t)r0, out_row * (size_t)nr);
            }
        }
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return total;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

// Populate [p, p + n) of a file mapping from the page cache (reading the file where it is not
// cached), so that the first graph run does not take the page faults; false on a read error.
bool populate(char *p, size_t n) {
    if (::madvise(p, n, MADV_POPULATE_READ) == 0) return true;
    if (errno != EINVAL) return false;  // EINVAL: a kernel without MADV_POPULATE_READ
    const size_t page = (size_t)::sysconf(_SC_PAGESIZE);
    volatile char sink = 0;
    for (size_t i = 0; i < n; i += page) sink = sink + p[i];
    return true;
}

// Place the tensors of `items` in a private mapping of the file (CPU backends only, every
// tensor held in its file dtype at an offset aligned to its element size): a buffer that
// points into the mapping, pages populated from the page cache. Returns nullptr when the
// items cannot be mapped (the caller allocates and reads instead); throws on a short file.
std::shared_ptr<WeightBuffer> map_items(std::shared_ptr<WeightStore> store, const std::string &path,
                                        std::vector<ReadItem> items, std::shared_ptr<Backend> backend) {
    if (!backend) throw nb::value_error("WeightStore.map: backend is None");
    if (ggml_backend_dev_type(backend->device) != GGML_BACKEND_DEVICE_TYPE_CPU) return nullptr;
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(backend->get());
    if (!ggml_backend_buft_is_host(buft)) return nullptr;
    const size_t align = ggml_backend_buft_get_alignment(buft);
    std::sort(items.begin(), items.end(), [](const ReadItem &a, const ReadItem &b) { return a.offset < b.offset; });
    items.erase(std::unique(items.begin(), items.end(), [](const ReadItem &a, const ReadItem &b) { return a.t == b.t; }),
                items.end());
    if (items.empty()) return nullptr;
    uint64_t lo = UINT64_MAX, hi = 0;
    size_t total = 0;
    for (auto &it : items) {
        const ggml_tensor *t = it.t;
        const size_t elem = ggml_is_quantized(t->type) ? 1 : ggml_type_size(t->type);
        if (it.file_type != t->type || it.offset % elem) return nullptr;
        lo = std::min<uint64_t>(lo, it.offset);
        hi = std::max<uint64_t>(hi, it.offset + ggml_nbytes(t));
        total += padded(ggml_backend_buft_get_alloc_size(buft, it.t), align);
    }
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return nullptr;
    }
    if ((uint64_t)st.st_size < hi) {
        ::close(fd);
        throw std::runtime_error(path + ": file ends before offset " + std::to_string(hi));
    }
    const uint64_t page = (uint64_t)::sysconf(_SC_PAGESIZE), base = lo / page * page;
    const size_t len = (size_t)(hi - base);
    void *addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)base);
    ::close(fd);
    if (addr == MAP_FAILED) return nullptr;
    char *p = static_cast<char *>(addr);
    bool ok = true;
    {
        nb::gil_scoped_release nogil;
        // populate the tensors' bytes only (a block range maps the other blocks' bytes too)
        auto range = [&](uint64_t from, uint64_t to) {  // file offsets [from, to)
            const size_t start = (size_t)((from - base) / page * page);
            ok = ok && populate(p + start, (size_t)(to - base) - start);
        };
        uint64_t a = items[0].offset, b = a;
        for (auto &it : items) {
            if (it.offset > b + page) {
                range(a, b);
                a = it.offset;
            }
            b = std::max<uint64_t>(b, it.offset + ggml_nbytes(it.t));
        }
        range(a, b);
    }
    if (!ok) {
        const int err = errno;
        ::munmap(addr, len);
        throw std::runtime_error(path + ": read failed: " + std::strerror(err));
    }
    auto wb = std::make_shared<WeightBuffer>();
    wb->ctx = store->ctx;
    wb->device = backend->device_name;
    wb->map_addr = addr;
    wb->map_len = len;
    wb->buf = ggml_backend_cpu_buffer_from_ptr(addr, len);
    if (!wb->buf) {
        ::munmap(addr, len);
        wb->map_addr = nullptr;
        throw std::runtime_error("WeightStore.map: could not wrap the mapping of " + path);
    }
    ggml_backend_buffer_set_usage(wb->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    wb->size = total + align;  // what allocate() reserves for the same tensors
    for (auto &it : items) {
        wb->tensors.push_back(it.t);
        if (ggml_backend_tensor_alloc(wb->buf, it.t, p + (it.offset - base)) != GGML_STATUS_SUCCESS) {
            wb->release();
            throw std::runtime_error("WeightStore.map: tensor placement failed");
        }
    }
    store->keep(wb);
    return wb;
}

// Arrays that are only read: read-only numpy arrays are accepted.
using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

}  // namespace

void register_weights(nb::module_ &m) {
    nb::class_<WeightBuffer>(m, "WeightBuffer", "Weight tensors placed in one backend buffer on one device.")
        .def_prop_ro("device", [](const WeightBuffer &b) { return b.device; })
        .def_prop_ro("size", [](const WeightBuffer &b) { return b.buf ? b.size : (size_t)0; },
                     "Bytes of the backend buffer (0 once freed).")
        .def_prop_ro("freed", [](const WeightBuffer &b) { return b.buf == nullptr; })
        .def_prop_ro("mapped", [](const WeightBuffer &b) { return b.map_addr != nullptr; },
                     "Whether the tensors point into a mapping of their file (WeightStore.map).")
        .def_prop_ro("names", [](const WeightBuffer &b) {
            std::vector<std::string> n;
            for (auto *t : b.tensors) n.push_back(tensor_name(t));
            return n;
        })
        .def("free", [](WeightBuffer &b) { b.release(); },
             "Free the buffer; its tensors become non-resident (idempotent).");

    nb::class_<WeightStore>(m, "WeightStore",
        "Named weight tensors (metadata only until allocated). specs: (name, dtype, shape)\n"
        "with numpy-order shapes.")
        .def(nb::new_(&make_store), nb::arg("specs"))
        .def("__len__", [](const WeightStore &s) { return s.by_name.size(); })
        .def("__contains__", [](const WeightStore &s, const std::string &n) { return s.by_name.count(n) > 0; })
        .def_prop_ro("names", [](const WeightStore &s) {
            std::vector<std::string> n;
            for (auto &kv : s.by_name) n.push_back(kv.first);
            return n;
        })
        .def("free_all", [](WeightStore &s) {
            for (auto &b : s.buffers) b->release();
            s.buffers.clear();
        }, "Free every buffer of this store.")
        .def_prop_ro("allocated_bytes", [](const WeightStore &s) {
            size_t n = 0;
            for (auto &b : s.buffers) n += b->buf ? b->size : 0;
            return n;
        }, "Bytes of this store's live buffers.")
        .def("tensor", &WeightStore::tensor, nb::arg("name"), "The tensor to use in graphs.")
        .def("nbytes", [](const WeightStore &s, const std::string &n) { return ggml_nbytes(s.get(n)); }, nb::arg("name"))
        .def("resident", [](const WeightStore &s, const std::string &n) { return s.get(n)->buffer != nullptr; },
             nb::arg("name"))
        .def("plan", [](WeightStore &s, const std::vector<std::string> &names, std::shared_ptr<Backend> b) {
            ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(b->get());
            for (auto &n : names) s.planned[s.get(n)] = buft;
        }, nb::arg("names"), nb::arg("backend"),
        "Record the device these tensors will be allocated on (for Graph.reserve before loading).")
        .def("alloc_size", [](WeightStore &s, const std::vector<std::string> &names, std::shared_ptr<Backend> b) {
            ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(b->get());
            size_t align = ggml_backend_buft_get_alignment(buft), total = 0;
            for (auto &n : names) total += padded(ggml_backend_buft_get_alloc_size(buft, s.get(n)), align);
            return total;
        }, nb::arg("names"), nb::arg("backend"), "Bytes allocate() would take for these tensors.")
        .def("allocate", [](WeightStore &s, const std::vector<std::string> &names, std::shared_ptr<Backend> b) {
            return allocate(s.shared_from_this(), names, b);
        }, nb::arg("names"), nb::arg("backend"),
        "Allocate one buffer on the backend's device holding these tensors; the store keeps it\n"
        "until WeightBuffer.free() or the store goes. Raises RuntimeError\n"
        "when the device cannot provide the memory, ValueError when a tensor is already allocated.")
        .def("read", [](WeightStore &s, const std::string &path,
                        const std::vector<std::tuple<std::string, uint64_t, std::string>> &items, size_t chunk,
                        int n_threads) {
            std::vector<ReadItem> v;
            for (auto &[name, off, dt] : items) {
                ggml_tensor *t = s.get(name);
                if (!t->buffer) throw nb::value_error(("WeightStore.read: tensor '" + name + "' is not allocated").c_str());
                ggml_type ft = dtype_from_name(dt, ("WeightStore.read: tensor '" + name + "'").c_str());
                if (ft != t->type) {
                    if (ft != GGML_TYPE_F32 && !ggml_get_type_traits(ft)->to_float)
                        throw nb::value_error(("WeightStore.read: cannot convert '" + name + "' from " + dt).c_str());
                    if (t->ne[0] % ggml_blck_size(ft))
                        throw nb::value_error(("WeightStore.read: '" + name + "' rows are not whole " + dt + " blocks").c_str());
                }
                v.push_back({t, off, ft});
            }
            if (chunk < 4096) throw nb::value_error("WeightStore.read: chunk_bytes must be >= 4096");
            nb::gil_scoped_release nogil;
            return read_items(path, v, chunk, std::max(1, n_threads));
        }, nb::arg("path"), nb::arg("items"), nb::arg("chunk_bytes") = (size_t)64 << 20, nb::arg("n_threads") = 1,
        "Fill allocated tensors from a file: items are (name, file offset in bytes, file dtype),\n"
        "converting the file dtype to the tensor's (float to float, or to a quantized type), GIL\n"
        "released. Tensors in host memory are filled from a read-only mapping of the file by\n"
        "n_threads threads (spans of about chunk_bytes); the others with large preads in file\n"
        "order. Returns the file bytes read. Raises RuntimeError when the file is short.")
        .def("map", [](WeightStore &s, const std::string &path,
                       const std::vector<std::tuple<std::string, uint64_t, std::string>> &items,
                       std::shared_ptr<Backend> b) {
            std::vector<ReadItem> v;
            for (auto &[name, off, dt] : items) {
                ggml_tensor *t = s.get(name);
                if (t->buffer) throw nb::value_error(("WeightStore.map: tensor '" + name + "' is already allocated").c_str());
                v.push_back({t, off, dtype_from_name(dt, ("WeightStore.map: tensor '" + name + "'").c_str())});
            }
            return map_items(s.shared_from_this(), path, v, b);
        }, nb::arg("path"), nb::arg("items"), nb::arg("backend"),
        "Place tensors in a private (copy-on-write) mapping of the file instead of allocating and\n"
        "reading them: items as for read(). Only on a CPU backend, for tensors held in their file\n"
        "dtype at offsets aligned to their element size; returns None otherwise (allocate and read\n"
        "instead). The pages are populated from the page cache before it returns. Raises\n"
        "RuntimeError for a file shorter than the items or a read error, ValueError when a tensor\n"
        "is already allocated.")
        .def("copy_from", [](WeightStore &s, WeightStore &src, const std::vector<std::string> &names) {
            std::vector<std::pair<ggml_tensor *, ggml_tensor *>> pairs;
            for (auto &n : names) {
                ggml_tensor *a = src.get(n), *b = s.get(n);
                if (!a->buffer || !b->buffer)
                    throw nb::value_error(("WeightStore.copy_from: '" + n + "' is not allocated on both sides").c_str());
                if (a->type != b->type || !ggml_are_same_shape(a, b))
                    throw nb::value_error(("WeightStore.copy_from: '" + n + "' differs in dtype or shape").c_str());
                pairs.emplace_back(a, b);
            }
            nb::gil_scoped_release nogil;
            uint64_t total = 0;
            for (auto &p : pairs) {
                ggml_backend_tensor_copy(p.first, p.second);
                total += ggml_nbytes(p.first);
            }
            return total;
        }, nb::arg("src"), nb::arg("names"), "Copy tensors of another store with the same specs (staging); returns bytes.")
        .def("set_data", [](WeightStore &s, const std::string &n, InArray arr) {
            ggml_tensor *t = s.get(n);
            if (!t->buffer) throw nb::value_error(("WeightStore.set_data: '" + n + "' is not allocated").c_str());
            if (arr.nbytes() != ggml_nbytes(t))
                throw nb::value_error(("WeightStore.set_data: '" + n + "' needs " + std::to_string(ggml_nbytes(t)) +
                                       " bytes, got " + std::to_string(arr.nbytes())).c_str());
            const void *src = arr.data();
            nb::gil_scoped_release nogil;
            ggml_backend_tensor_set(t, src, 0, ggml_nbytes(t));
        }, nb::arg("name"), nb::arg("array"), "Write raw bytes (a C-contiguous array of the exact size).")
        .def("get_bytes", [](WeightStore &s, const std::string &n) {
            ggml_tensor *t = s.get(n);
            if (!t->buffer) throw nb::value_error(("WeightStore.get_bytes: '" + n + "' is not allocated").c_str());
            std::string out(ggml_nbytes(t), '\0');
            {
                nb::gil_scoped_release nogil;
                ggml_backend_tensor_get(t, out.data(), 0, out.size());
            }
            return nb::bytes(out.data(), out.size());
        }, nb::arg("name"), "The tensor's raw bytes.");

    m.def("supports_mul_mat", [](std::shared_ptr<Backend> b, const std::string &dtype) {
        ggml_type type = dtype_from_name(dtype, "supports_mul_mat");
        Context c(4 * ggml_tensor_overhead() + 1024);
        int64_t k = std::max<int64_t>(256, ggml_blck_size(type));
        ggml_tensor *w = ggml_new_tensor_2d(c.ctx, type, k, 8);
        ggml_tensor *x = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, k, 4);
        ggml_tensor *r = ggml_mul_mat(c.ctx, w, x);
        return ggml_backend_supports_op(b->get(), r);
    }, nb::arg("backend"), nb::arg("dtype"), "Whether the backend multiplies matrices stored in this dtype.");

    m.def("convert_rows", [](nb::bytes data, const std::string &src, const std::string &dst, int64_t ne0) {
        ggml_type st = dtype_from_name(src, "convert_rows: src"), dt = dtype_from_name(dst, "convert_rows: dst");
        if (ne0 <= 0 || ne0 % ggml_blck_size(st) || ne0 % ggml_blck_size(dt))
            throw nb::value_error("convert_rows: the row length is not a whole number of blocks of both dtypes");
        if (st != GGML_TYPE_F32 && !ggml_get_type_traits(st)->to_float)
            throw nb::value_error(("convert_rows: no conversion from " + src).c_str());
        const size_t in_row = ggml_row_size(st, ne0), out_row = ggml_row_size(dt, ne0);
        if (data.size() % in_row) throw nb::value_error("convert_rows: data is not a whole number of rows");
        const int64_t nrows = (int64_t)(data.size() / in_row);
        std::string out((size_t)nrows * out_row, '\0');
        std::vector<float> f32;
        const char *in = data.c_str();
        {
            nb::gil_scoped_release nogil;
            convert_rows(in, st, out.data(), dt, nrows, ne0, f32);
        }
        return nb::bytes(out.data(), out.size());
    }, nb::arg("data"), nb::arg("src"), nb::arg("dst"), nb::arg("ne0"),
    "Convert raw rows of ne0 elements from dtype src to dtype dst (through f32; any float or\n"
    "quantized type ggml converts): the host side of merging a patch into a stored weight.");

    m.def("dtype_size", [](const std::string &dtype, int64_t n) {
        ggml_type t = dtype_from_name(dtype, "dtype_size");
        if (n % ggml_blck_size(t)) throw nb::value_error("dtype_size: n is not a whole number of blocks");
        return ggml_row_size(t, n);
    }, nb::arg("dtype"), nb::arg("n"), "Bytes of n elements of dtype (n a multiple of its block size).");
}

}  // namespace sdplan
