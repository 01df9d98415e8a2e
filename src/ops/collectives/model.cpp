// The collectives' model: what `auto` picks and how many CTAs and threads a call uses.
#include <algorithm>

#include "collectives_impl.hpp"

namespace weft::ops::detail {

namespace {
constexpr Named<coll::Algo> kAlgoNames[] = {
    {coll::Algo::kAllReduceOneShot, "all-reduce (one-shot)"},
    {coll::Algo::kAllReduceTwoShot, "all-reduce (two-shot)"},
    {coll::Algo::kAllReduceLL, "all-reduce (ll)"},
    {coll::Algo::kAllReduceLL128, "all-reduce (ll128)"},
    {coll::Algo::kAllGather, "all-gather"},
    {coll::Algo::kAllGatherLL, "all-gather (ll)"},
    {coll::Algo::kReduceScatter, "reduce-scatter"},
    {coll::Algo::kReduceScatterLL, "reduce-scatter (ll)"},
    {coll::Algo::kAllToAll, "all-to-all"},
    {coll::Algo::kAllToAllLL, "all-to-all (ll)"},
    {coll::Algo::kAllToAllV, "all-to-all by counts"},
};
}  // namespace

const char* algo_name(coll::Algo a) { return name_in(kAlgoNames, a); }

bool is_ll(coll::Algo a) {
  return a == coll::Algo::kAllReduceLL || a == coll::Algo::kAllGatherLL || a == coll::Algo::kReduceScatterLL ||
         a == coll::Algo::kAllToAllLL;
}

bool is_all_reduce(coll::Algo a) {
  return a == coll::Algo::kAllReduceOneShot || a == coll::Algo::kAllReduceTwoShot || a == coll::Algo::kAllReduceLL ||
         a == coll::Algo::kAllReduceLL128;
}

int coll_ctas(coll::Algo algo, uint64_t bytes, int ctas_override) {
  if (ctas_override > 0) return ctas_override;
  int ctas;
  if (algo == coll::Algo::kAllReduceLL128) {
    // LL128: four 128-byte lines (120 data bytes each) per warp and step; a CTA per four
    // lines, up to 128 CTAs (LL measured fastest with its lines spread over 128 CTAs).
    const uint64_t lines = (bytes + 119) / 120;
    ctas = static_cast<int>(std::clamp<uint64_t>((lines + 3) / 4, 1, 128));
  } else if (is_ll(algo)) {
    // LL (bytes = one peer's payload): a CTA per 8 lines (16 bytes, 8 of them data), up to
    // 128; about one line per thread, so no thread has a chain of lines to go through. 8 KiB
    // -> 128 CTAs of 64 threads, 1 MiB -> 128 CTAs of 512 threads, 2 lines each (measured
    // against fewer CTAs: docs/collectives.md, "Auto rules").
    const uint64_t lines = (bytes + 7) / 8;
    ctas = static_cast<int>(std::clamp<uint64_t>((lines + 7) / 8, 1, 128));
  } else {
    // One CTA moves ~20 GB/s over NVLink, so a CTA should own ~32 KiB: a 256 KiB call then
    // runs 8 CTAs at ~2 us of wire time, not 1 CTA at 12 us. From 32 MiB the bandwidth-bound
    // methods take 128 CTAs: NVLink push still grows past 32 CTAs, and the local reduce/copy
    // passes want HBM loads in flight (docs/collectives.md, "Auto rules").
    const uint64_t per_cta = 32ull << 10;
    const bool wide = algo == coll::Algo::kAllGather || algo == coll::Algo::kAllToAll ||
                      algo == coll::Algo::kReduceScatter || algo == coll::Algo::kAllReduceTwoShot;
    const uint64_t cap = algo == coll::Algo::kAllReduceOneShot ? 32 : wide && bytes >= (32ull << 20) ? 128 : 64;
    const uint64_t want = (bytes + per_cta - 1) / per_cta;
    ctas = static_cast<int>(std::clamp<uint64_t>(want, 1, cap));
  }
  return ctas;
}

int coll_threads(coll::Algo algo, uint64_t bytes, int ctas) {
  if (algo == coll::Algo::kAllReduceLL128) {
    // A warp per four lines of the CTA's slice, at least two warps.
    const uint64_t lines = coll::ll128_lines_per_cta(bytes, ctas, 1);
    return static_cast<int>(std::clamp<uint64_t>((lines + 3) / 4 * 32, 64, coll::kCtaThreads));
  }
  if (!is_ll(algo)) return coll::kCtaThreads;
  // LL: the lines of one CTA's slice, one per thread, in whole warps (at least two).
  const uint64_t lines = (bytes + 7) / 8;
  const uint64_t per_cta = (lines + static_cast<uint64_t>(ctas) - 1) / static_cast<uint64_t>(ctas);
  return static_cast<int>(std::clamp<uint64_t>((per_cta + 31) / 32 * 32, 64, coll::kCtaThreads));
}

Method auto_all_reduce(uint64_t bytes, int world) {
  // One-shot methods send (world-1) x bytes from every rank, two-shot ~2 x bytes in two
  // rounds. LL128 is a one-shot with one NVLink crossing, no flag round and 16/15 of the
  // bytes on the link: it takes every call that sends <= 4 MiB per rank, two-shot above. On
  // more ranks the one-shot's extra bytes grow: LL128 puts (w-1) x 16/15 x bytes on each
  // rank's link, two-shot 2 (w-1)/w x bytes in two crossings; LL128 is kept while its extra
  // bytes are at most 2 MiB (~6 us of NVLink, about what two-shot's second crossing and flag
  // round cost). Measurements and predictions behind it: docs/collectives.md, "Auto rules".
  const uint64_t w = static_cast<uint64_t>(world);
  const uint64_t sent = bytes * (w - 1);
  const double extra = static_cast<double>(bytes) * (static_cast<double>(w - 1) * 16.0 / 15.0 - 2.0 * (w - 1) / w);
  return sent <= (4ull << 20) && extra <= static_cast<double>(2ull << 20) ? Method::kLowLatency128 : Method::kTwoShot;
}

Method auto_exchange(uint64_t bytes_to_peers) {
  // direct pays a handshake and a completion flag round (~2 x 1.3 us) on top of the push;
  // LL one crossing at twice the bytes: LL up to 1.5 MiB sent per rank (docs/collectives.md,
  // "Auto rules").
  return bytes_to_peers <= (3ull << 19) ? Method::kLowLatency : Method::kDirect;
}

// Elements of staging one (parity, source) slot holds (LL: 16-byte lines of 8 data bytes;
// LL128: 128-byte lines, the same number for every CTA's slice).
uint64_t coll_staging_elems(coll::Algo a, uint64_t count, size_t elem, int ctas) {
  switch (a) {
    case coll::Algo::kAllReduceLL128:
      return static_cast<uint64_t>(ctas) * coll::ll128_lines_per_cta(count, ctas, elem);
    case coll::Algo::kAllReduceLL:
    case coll::Algo::kAllGatherLL:
    case coll::Algo::kReduceScatterLL:
    case coll::Algo::kAllToAllLL:
      return (count * elem + 7) / 8;
    case coll::Algo::kAllReduceOneShot:
    case coll::Algo::kAllReduceTwoShot:
    case coll::Algo::kReduceScatter:
      return count;
    default:
      return 0;
  }
}

}  // namespace weft::ops::detail
