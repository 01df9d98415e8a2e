// Private to src/ops: the on-disk tuning cache that `auto` reads and `weft bench OP --tune`
// writes (one JSON object, one entry per op and shape: {"method", "chunks", "us"}).
//
// A cache is advice: a missing, unreadable or broken file, or an entry whose fields have the
// wrong type or range, is ignored (the cost model decides); the next store rewrites the file.
// Stores are atomic (a temporary file renamed over the cache).
#pragma once
#include <optional>
#include <string>

namespace weft::ops::detail {

struct TunedChoice {
  std::string method;  // the method's name (the op parses it against its table)
  int chunks = 0;      // 0: none recorded
};

// The cache's path: `configured` ("-": none; non-empty: that file), else WEFT_TUNE_CACHE, else
// $XDG_CACHE_HOME/weft/<file>, else ~/.cache/weft/<file>; "" when there is none.
std::string tuning_cache_path(const std::string& configured, const std::string& file);

// The entry `key` of the cache at `path`, if it is well formed (a method name of at most 32
// characters, chunks an integer in [0, 4096] when present).
std::optional<TunedChoice> read_tuned_choice(const std::string& path, const std::string& key);

// Writes `key` = {method, chunks, us} into the cache at `path`, keeping the other entries.
// Throws InvalidArgument naming the path when it cannot be written.
void store_tuned_choice(const std::string& path, const std::string& key, const TunedChoice& c, double us);

}  // namespace weft::ops::detail
