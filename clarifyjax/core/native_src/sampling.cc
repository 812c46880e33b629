// Each row's top-p threshold on the CPU, by radix selection: the smallest logit that top-p keeps.
//
// A token is kept when the probability mass of the tokens with a larger logit is < top_p
// (tokens of equal logits stand or fall together; the most likely always stays). The row's
// weights exp(logit - max) are summed, in double precision, into 4096 bins by the distance below
// the row's largest logit (linear bins over the 87 logits where float32's exp is nonzero); the bin
// where the mass from the top reaches top_p * total holds the threshold. Its tokens (a few hundred
// in a flat 32k row) are gathered and binned again by their logit's order-preserving key, 8 bits
// at a time, carrying the mass above them: the key found is the threshold's own bits. The passes
// over the whole row: its max; the weights and bins (8 lanes at a time); the sums into the bins;
// the gather of the chosen bin. Rows are shared with XLA's CPU thread pool. Called by
// clarifyjax/core/native.py through XLA's FFI; other backends run the XLA path of
// clarifyjax/decoding/filters.py instead.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Level 1 bins the distance below the row's largest logit, d = max - logit, linearly: kSpan
// logits (beyond which exp(-d) is 0 in float32) in kBins bins, a few hundred tokens each in a
// flat 32k row. A larger logit never lands in a later bin, so the bins split the row by value.
constexpr int kBins = 4096;
constexpr float kSpan = 87.33f;  // exp(-87.33) ~ 1.2e-38, float32's smallest normal
constexpr float kScale = (kBins - 1) / kSpan;  // bin kBins - 1 holds every d beyond the span
constexpr int kLanes = 8;

// GCC's vector extensions: 8 lanes on any target it supports (two SSE or one AVX register)
typedef float Floats __attribute__((vector_size(4 * kLanes)));
typedef int32_t Ints __attribute__((vector_size(4 * kLanes)));

inline Floats Splat(float x) { return Floats{} + x; }

inline Floats Load(const float* x) {
  Floats v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

// exp(-d) for d >= 0 to about 1 ulp (Cephes' expf polynomial); 0 for d beyond kSpan, +inf or
// NaN. Every pass computes it through this one function, so a token's weight is the same bits
// wherever it is needed.
inline Floats ExpOfMinus(Floats d) {
  const Ints inside = d < kSpan;  // false for NaN
  const Floats c = inside ? -d : Splat(-kSpan);
  const Floats big = Splat(12582912.0f);  // 1.5 * 2**23: adding it rounds to an integer
  const Floats n = (c * 1.44269504088896341f + big) - big;  // in [-126, 0]
  Floats r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Floats p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Floats y = p * r * r + r + 1.0f;
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  return inside ? y * reinterpret_cast<const Floats&>(bits) : Splat(0.0f);
}

inline Ints BinOf(Floats d) {
  const Floats scaled = d < kSpan ? d * kScale : Splat(static_cast<float>(kBins - 1));
  return __builtin_convertvector(scaled, Ints);
}

inline uint32_t OrderedKey(float x) {  // larger float -> larger key
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

inline float FromKey(uint32_t key) {
  uint32_t u = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The row padded with -inf to whole chunks of kLanes (-inf weighs 0 and lands in the last bin).
struct Row {
  const float* x;
  int64_t v;
  float tail[kLanes];
  int64_t whole;  // elements in whole chunks

  Row(const float* x_, int64_t v_) : x(x_), v(v_), whole(v_ - v_ % kLanes) {
    for (int j = 0; j < kLanes; ++j)
      tail[j] = whole + j < v ? x[whole + j] : -std::numeric_limits<float>::infinity();
  }
  int64_t chunks() const { return (v + kLanes - 1) / kLanes; }
  Floats chunk(int64_t c) const {
    return c * kLanes < whole ? Load(x + c * kLanes) : Load(tail);
  }
};

float RowMax(const Row& row) {  // NaN compares false and is skipped
  const Floats ninf = Splat(-std::numeric_limits<float>::infinity());
  Floats acc[4] = {ninf, ninf, ninf, ninf};  // four chains: max's latency is not the limit
  const int64_t n = row.chunks();
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int j = 0; j < 4; ++j) {
      const Floats v = row.chunk(c + j);
      acc[j] = v > acc[j] ? v : acc[j];
    }
  for (; c < n; ++c) {
    const Floats v = row.chunk(c);
    acc[0] = v > acc[0] ? v : acc[0];
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < 4; ++j)
    for (int k = 0; k < kLanes; ++k) m = acc[j][k] > m ? acc[j][k] : m;
  return m;
}

// Among the n gathered (key, weight) pairs, the key where the mass from the largest key down
// first reaches `target`, `above` being the mass of every larger token outside them: four
// levels of 8 bits.
uint32_t RadixCrossing(uint32_t* pk, float* pw, int64_t n, double target, double above) {
  double bins[256];
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    std::memset(bins, 0, sizeof bins);
    for (int64_t k = 0; k < n; ++k) bins[(pk[k] >> shift) & 255u] += pw[k];
    uint32_t chosen = 0;  // rounding cannot run past the last bin; stay in range regardless
    double cum = above;
    for (int b = 255; b >= 0; --b) {
      const double next = cum + bins[b];
      if (next >= target) {
        chosen = static_cast<uint32_t>(b);
        break;
      }
      cum = next;
    }
    above = cum;
    int64_t kept = 0;
    for (int64_t k = 0; k < n; ++k) {
      if (((pk[k] >> shift) & 255u) == chosen) {
        pk[kept] = pk[k];
        pw[kept] = pw[k];
        ++kept;
      }
    }
    n = kept;
    prefix |= chosen << shift;
  }
  return prefix;
}

struct Scratch {
  std::vector<double> bins = std::vector<double>(kBins);
  std::vector<float> weight;
  std::vector<int32_t> bin;
  std::vector<float> picked_weight;
  std::vector<uint32_t> picked_key;
};

float RowThreshold(const float* x, int64_t v, float top_p, Scratch& s) {
  const Row row(x, v);
  const float m = RowMax(row);
  if (!(top_p > 0.0f) || std::isinf(m)) return m;  // only the most likely (or a row of -inf)

  const int64_t n_chunks = row.chunks();
  s.weight.resize(n_chunks * kLanes);
  s.bin.resize(n_chunks * kLanes);
  float* w = s.weight.data();
  int32_t* bin = s.bin.data();
  for (int64_t c = 0; c < n_chunks; ++c) {  // vectorized: weights and bins of 8 tokens at once
    const Floats d = m - row.chunk(c);  // >= 0; +inf for -inf, NaN for NaN
    const Floats wc = ExpOfMinus(d);
    const Ints bc = BinOf(d);
    std::memcpy(w + c * kLanes, &wc, sizeof wc);
    std::memcpy(bin + c * kLanes, &bc, sizeof bc);
  }
  double* bins = s.bins.data();
  std::memset(bins, 0, sizeof(double) * kBins);
  const int64_t padded = n_chunks * kLanes;  // the padding weighs 0
  for (int64_t k = 0; k < padded; ++k) bins[bin[k]] += w[k];
  double total = 0.0;
  for (int b = 0; b < kBins; ++b) total += bins[b];
  if (!(total > 0.0)) return m;
  const double target = static_cast<double>(top_p) * total;
  double above = 0.0;
  int chosen = -1;
  for (int b = 0; b < kBins; ++b) {
    const double next = above + bins[b];
    if (next >= target) {
      chosen = b;
      break;
    }
    above = next;
  }
  if (chosen < 0) return -std::numeric_limits<float>::infinity();  // top_p >= 1: every token

  // gather the chosen bin's tokens (a few hundred in a flat 32k row) with their weights
  s.picked_key.resize(padded);
  s.picked_weight.resize(padded);
  uint32_t* pk = s.picked_key.data();
  float* pw = s.picked_weight.data();
  int64_t n = 0;
  const Ints wanted = Ints{} + chosen;
  for (int64_t c = 0; c < n_chunks; ++c) {
    Ints bc;
    std::memcpy(&bc, bin + c * kLanes, sizeof bc);
    const Ints hit = bc == wanted;
    uint64_t words[kLanes / 2];
    std::memcpy(words, &hit, sizeof words);
    uint64_t any = 0;
    for (uint64_t word : words) any |= word;
    if (any == 0) continue;
    const Floats xs = row.chunk(c);
    for (int j = 0; j < kLanes; ++j) {
      const float wj = w[c * kLanes + j];
      if (hit[j] && wj > 0.0f) {  // a weightless token never reaches the target
        pk[n] = OrderedKey(xs[j]);
        pw[n] = wj;
        ++n;
      }
    }
  }
  return FromKey(RadixCrossing(pk, pw, n, target, above));
}

// The n largest values of a row, descending (what lax.top_k returns as its values; NaN never
// counts, and a row with fewer than n other values is filled with -inf). One pass, 8 lanes at a
// time, against the least of a min-heap of the n kept so far: in a row of random order only
// about n * ln(V / n) values ever enter the heap.
void RowTopK(const float* x, int64_t v, int64_t n, float* out, std::vector<float>& heap) {
  const float ninf = -std::numeric_limits<float>::infinity();
  heap.assign(n, ninf);
  float* h = heap.data();
  const Row row(x, v);
  const int64_t n_chunks = row.chunks();
  Floats least = Splat(ninf);
  for (int64_t c = 0; c < n_chunks; ++c) {
    const Floats xs = row.chunk(c);
    const Ints above = xs > least;
    uint64_t words[kLanes / 2];
    std::memcpy(words, &above, sizeof words);
    uint64_t any = 0;
    for (uint64_t word : words) any |= word;
    if (any == 0) continue;
    for (int j = 0; j < kLanes; ++j) {
      const float value = xs[j];
      if (!(value > h[0])) continue;
      int64_t i = 0;  // replace the least, then sift it down
      for (;;) {
        const int64_t left = 2 * i + 1;
        if (left >= n) break;
        const int64_t right = left + 1;
        const int64_t smaller = (right < n && h[right] < h[left]) ? right : left;
        if (!(h[smaller] < value)) break;
        h[i] = h[smaller];
        i = smaller;
      }
      h[i] = value;
    }
    least = Splat(h[0]);
  }
  std::sort(heap.begin(), heap.end(), [](float a, float b) { return a > b; });
  std::memcpy(out, h, sizeof(float) * n);
}

// Rows are shared out through an atomic counter among the calling thread and tasks scheduled
// on XLA's CPU thread pool; the caller waits only for rows a task has begun (a task that starts
// after the last row finds none and returns), so a busy or absent pool costs no deadlock.
// make_worker() gives each thread its own callable(row), which owns its scratch.
template <typename MakeWorker>
void ForEachRow(ffi::ThreadPool& pool, int64_t rows, MakeWorker make_worker) {
  struct Progress {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> finished{0};
  };
  auto progress = std::make_shared<Progress>();
  auto run = [progress, rows, make_worker] {
    auto work = make_worker();
    for (int64_t r = progress->next.fetch_add(1); r < rows; r = progress->next.fetch_add(1)) {
      work(r);
      progress->finished.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), rows) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule(decltype(run)(run));  // a copy each
  run();
  while (progress->finished.load(std::memory_order_acquire) < rows) std::this_thread::yield();
}

ffi::Error TopPThresholdImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                             ffi::Buffer<ffi::F32> top_p, ffi::ResultBuffer<ffi::F32> out) {
  auto dims = logits.dimensions();
  if (dims.size() == 0 || dims.back() == 0)
    return ffi::Error::InvalidArgument("nucleus_threshold: logits need a vocabulary axis");
  const int64_t v = dims.back();
  const int64_t rows = static_cast<int64_t>(logits.element_count()) / v;
  if (static_cast<int64_t>(top_p.element_count()) != rows ||
      static_cast<int64_t>(out->element_count()) != rows)
    return ffi::Error::InvalidArgument("nucleus_threshold: one top_p and one output per row");
  const float* x = logits.typed_data();
  const float* p = top_p.typed_data();
  float* o = out->typed_data();
  ForEachRow(pool, rows, [=] {
    return [=, s = Scratch()](int64_t r) mutable { o[r] = RowThreshold(x + r * v, v, p[r], s); };
  });
  return ffi::Error::Success();
}

ffi::Error TopKValuesImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                          ffi::ResultBuffer<ffi::F32> out) {
  auto dims = logits.dimensions();
  auto out_dims = out->dimensions();
  if (dims.size() == 0 || dims.back() == 0 || out_dims.size() != dims.size())
    return ffi::Error::InvalidArgument("largest_values: logits need a vocabulary axis");
  const int64_t v = dims.back();
  const int64_t n = out_dims.back();
  const int64_t rows = static_cast<int64_t>(logits.element_count()) / v;
  if (n < 1 || n > v || static_cast<int64_t>(out->element_count()) != rows * n)
    return ffi::Error::InvalidArgument("largest_values: 1 <= n <= vocabulary, n per row");
  const float* x = logits.typed_data();
  float* o = out->typed_data();
  ForEachRow(pool, rows, [=] {
    return [=, heap = std::vector<float>()](int64_t r) mutable {
      RowTopK(x + r * v, v, n, o + r * n, heap);
    };
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ClarifyjaxTopPThreshold, TopPThresholdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(ClarifyjaxTopKValues, TopKValuesImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
