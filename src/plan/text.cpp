#include "weft/plan/text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <set>

#include "weft/core/error.hpp"

namespace weft::plan {
namespace {

// Guards the parser's allocations against hostile input (a fuzzer, a typo in a world size).
constexpr int64_t kMaxWorld = 4096;
// Bounds that keep every sum and difference the verifier forms far from int64 overflow.
constexpr int64_t kMaxExtent = int64_t{1} << 48;  // rows, columns, region bounds
constexpr int64_t kMaxCount = int64_t{1} << 40;   // signal increments and totals

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

bool valid_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!name_char(c)) return false;
  return true;
}

// A cursor over one line; every error carries the line and the column where it was found.
class Line {
 public:
  Line(std::string_view src, std::string_view text, int line) : src_(src), text_(text), line_(line) {}

  [[noreturn]] void fail(size_t col, const std::string& what) const {
    throw InvalidArgument(fmt::format("{}:{}:{}: {}", src_, line_, col + 1, what));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ >= text_.size();
  }
  size_t pos() const { return pos_; }
  size_t size() const { return text_.size(); }
  char peek_char() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  // The next whitespace-delimited word, without consuming it.
  std::string_view peek_word() {
    skip_space();
    size_t e = pos_;
    while (e < text_.size() && text_[e] != ' ' && text_[e] != '\t' && text_[e] != '\r') ++e;
    return text_.substr(pos_, e - pos_);
  }
  std::string_view word(const char* what) {
    std::string_view w = peek_word();
    if (w.empty()) fail(pos_, fmt::format("expected {} but the line ends", what));
    pos_ += w.size();
    return w;
  }
  void keyword(std::string_view kw) {
    const size_t at = (skip_space(), pos_);
    std::string_view w = peek_word();
    if (w != kw) fail(at, fmt::format("expected '{}' but found '{}'", kw, w.empty() ? "end of line" : w));
    pos_ += w.size();
  }
  // Characters inside a word.
  bool eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* context) {
    if (!eat(c))
      fail(pos_, fmt::format("expected '{}' {} but found {}", c, context,
                             pos_ < text_.size() ? fmt::format("'{}'", text_[pos_]) : std::string("end of line")));
  }
  int64_t integer(const char* what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
    const size_t at = pos_;
    int64_t v = 0;
    const char* b = text_.data() + pos_;
    const char* e = text_.data() + text_.size();
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc::result_out_of_range) fail(at, fmt::format("{} does not fit in 64 bits", what));
    if (ec != std::errc() || p == b)
      fail(at, fmt::format("expected {} (an integer) but found {}", what,
                           at < text_.size() ? fmt::format("'{}'", text_[at]) : std::string("end of line")));
    pos_ += static_cast<size_t>(p - b);
    if (v < lo || v > hi) fail(at, fmt::format("{} {} outside [{}, {}]", what, v, lo, hi));
    return v;
  }
  std::string_view name(const char* what) {
    const size_t at = pos_;
    while (pos_ < text_.size() && name_char(text_[pos_])) ++pos_;
    if (pos_ == at) fail(at, fmt::format("expected {} (letters, digits, _ . -)", what));
    return text_.substr(at, pos_ - at);
  }
  // After a word-internal parse: the word must end here.
  void end_word(const char* what) {
    if (pos_ < text_.size() && text_[pos_] != ' ' && text_[pos_] != '\t' && text_[pos_] != '\r')
      fail(pos_, fmt::format("unexpected '{}' after {}", text_[pos_], what));
  }

 private:
  std::string_view src_;
  std::string_view text_;
  int line_;
  size_t pos_ = 0;
};

Kind parse_kind(Line& l) {
  const size_t at = (l.skip_space(), l.pos());
  const std::string_view w = l.word("a transfer kind");
  for (Kind k : {Kind::kPush, Kind::kPull, Kind::kReduce, Kind::kCopy})
    if (w == to_string(k)) return k;
  l.fail(at, fmt::format("unknown transfer kind '{}' (push, pull, reduce, copy)", w));
}

Engine parse_engine(Line& l) {
  const size_t at = (l.skip_space(), l.pos());
  const std::string_view w = l.word("an engine");
  for (Engine e : {Engine::kSm, Engine::kTma, Engine::kCopyEngine, Engine::kNccl, Engine::kNet})
    if (w == to_string(e)) return e;
  l.fail(at, fmt::format("unknown engine '{}' (sm, tma, copy_engine, nccl, net)", w));
}

Role parse_role(Line& l) {
  const size_t at = (l.skip_space(), l.pos());
  const std::string_view w = l.word("a tensor role");
  for (Role r : {Role::kInput, Role::kOutput, Role::kScratch})
    if (w == to_string(r)) return r;
  l.fail(at, fmt::format("unknown tensor role '{}' (input, output, scratch)", w));
}

// RANK:TENSOR[r0:r1,c0:c1] or, on a one-row tensor, RANK:TENSOR[b0:b1].
Endpoint parse_endpoint(Line& l, const CommPlan& p, const char* what) {
  l.skip_space();
  if (l.at_end()) l.fail(l.pos(), fmt::format("expected the {} (rank:tensor[rows,cols]) but the line ends", what));
  Endpoint e;
  e.rank = static_cast<int>(l.integer("a rank", 0, p.world - 1));
  l.expect(':', "after the rank");
  const size_t at = l.pos();
  const std::string_view tn = l.name("a tensor name");
  e.tensor = p.tensor_id(tn);
  if (e.tensor < 0) l.fail(at, fmt::format("unknown tensor '{}'", tn));
  l.expect('[', "to open the region");
  const int64_t a = l.integer("a region bound", 0, kMaxExtent);
  l.expect(':', "in the region");
  const int64_t b = l.integer("a region bound", 0, kMaxExtent);
  if (l.eat(',')) {
    const int64_t c = l.integer("a region bound", 0, kMaxExtent);
    l.expect(':', "in the region");
    const int64_t d = l.integer("a region bound", 0, kMaxExtent);
    e.region = Region::rect(a, b, c, d);
  } else {
    if (l.pos() < l.size() && l.peek_char() != ']') l.expect(']', "or ',' in the region");
    if (p.tensors[static_cast<size_t>(e.tensor)].rows != 1)
      l.fail(at, fmt::format("a byte range [b0:b1] needs a one-row tensor; '{}' has {} rows", tn,
                             p.tensors[static_cast<size_t>(e.tensor)].rows));
    e.region = Region::bytes(a, b);
  }
  l.expect(']', "to close the region");
  l.end_word("the region");
  return e;
}

// RANK.INDEX
SignalRef parse_signal_ref(Line& l, const CommPlan& p) {
  l.skip_space();
  SignalRef s;
  s.rank = static_cast<int>(l.integer("a signal's rank", 0, p.world - 1));
  l.expect('.', "between the signal's rank and index");
  s.index = static_cast<int>(l.integer("a signal index", 0, INT32_MAX));
  return s;
}

}  // namespace

CommPlan parse_plan(std::string_view text, std::string_view source) {
  CommPlan p;
  bool have_world = false, have_name = false;
  std::set<int64_t> chunks;
  int line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view raw = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    const size_t hash = raw.find('#');
    if (hash != std::string_view::npos) raw = raw.substr(0, hash);
    Line l(source, raw, line_no);
    if (l.at_end()) continue;
    const size_t at = l.pos();
    const std::string_view kw = l.word("a keyword");
    auto need_world = [&] {
      if (!have_world) l.fail(at, fmt::format("'{}' before 'world'", kw));
    };
    if (kw == "plan") {
      if (have_name) l.fail(at, "second 'plan' line");
      l.skip_space();
      p.name = std::string(l.name("the plan's name"));
      l.end_word("the plan's name");
      have_name = true;
    } else if (kw == "world") {
      if (have_world) l.fail(at, "second 'world' line");
      l.skip_space();
      p.world = static_cast<int>(l.integer("the world size", 1, kMaxWorld));
      l.end_word("the world size");
      p.queues.resize(static_cast<size_t>(p.world));
      have_world = true;
    } else if (kw == "tensor") {
      need_world();
      Tensor t;
      l.skip_space();
      const size_t nat = l.pos();
      t.name = std::string(l.name("the tensor's name"));
      l.end_word("the tensor's name");
      if (p.tensor_id(t.name) >= 0) l.fail(nat, fmt::format("tensor '{}' declared twice", t.name));
      l.skip_space();
      t.rows = l.integer("the row count", 1, kMaxExtent);
      l.expect('x', "between rows and columns");
      t.cols = l.integer("the column count", 1, kMaxExtent);
      l.end_word("the shape");
      t.role = parse_role(l);
      while (!l.at_end()) {
        const size_t oat = l.pos();
        const std::string_view opt = l.peek_word();
        if (opt == "sum") {
          l.word("an option");
          t.sum = true;
        } else if (opt.substr(0, 5) == "elem=") {
          l.word("");  // consume, then re-read the number from the word's text
          Line sub(source, opt.substr(5), line_no);
          t.elem_bytes = static_cast<int>(sub.integer("the element size", 1, 1024));
          if (!sub.at_end()) l.fail(oat + 5, "expected the element size in bytes after 'elem='");
        } else if (opt.substr(0, 6) == "valid=") {
          l.word("");
          Line sub(source, opt.substr(6), line_no);
          do {
            t.valid_rows.push_back(sub.integer("a valid row count", 0, t.rows));
            if (t.valid_rows.size() > static_cast<size_t>(p.world)) l.fail(oat, "more valid row counts than ranks");
          } while (sub.eat(','));
          if (!sub.at_end()) l.fail(oat + 6 + sub.pos(), "expected comma-separated row counts after 'valid='");
        } else {
          l.fail(oat, fmt::format("unknown tensor option '{}' (sum, elem=N, valid=a,b,...)", opt));
        }
      }
      p.tensors.push_back(std::move(t));
    } else if (kw == "signal") {
      need_world();
      Signal s;
      const SignalRef r = parse_signal_ref(l, p);
      s.rank = r.rank;
      s.index = r.index;
      l.end_word("the signal");
      if (p.find_signal(s.rank, s.index)) l.fail(at, fmt::format("signal {}.{} declared twice", s.rank, s.index));
      l.keyword("expect");
      l.skip_space();
      s.expected = l.integer("the expected notify count", 0, kMaxCount);
      l.end_word("the expected count");
      p.signals.push_back(s);
    } else if (kw == "on") {
      need_world();
      l.skip_space();
      const int exec = static_cast<int>(l.integer("the executing rank", 0, p.world - 1));
      l.end_word("the executing rank");
      Transfer t;
      l.keyword("chunk");
      l.skip_space();
      const size_t cat = l.pos();
      t.chunk = l.integer("the chunk id", 0);
      l.end_word("the chunk id");
      if (!chunks.insert(t.chunk).second) l.fail(cat, fmt::format("chunk {} defined twice", t.chunk));
      t.kind = parse_kind(l);
      t.engine = parse_engine(l);
      t.src = parse_endpoint(l, p, "source");
      l.keyword("->");
      t.dst = parse_endpoint(l, p, "destination");
      t.signal = SignalRef{};
      t.increment = 1;
      bool have_signal = false, have_deps = false;
      while (!l.at_end()) {
        const size_t oat = l.pos();
        const std::string_view opt = l.word("an option");
        if (opt == "signal" && !have_signal) {
          t.signal = parse_signal_ref(l, p);
          l.expect('+', "before the signal increment");
          t.increment = l.integer("the signal increment", 1, kMaxCount);
          l.end_word("the signal increment");
          have_signal = true;
        } else if (opt == "deps" && !have_deps) {
          l.skip_space();
          do t.deps.push_back(l.integer("a chunk id", 0));
          while (l.eat(','));
          l.end_word("the deps");
          have_deps = true;
        } else {
          l.fail(oat, fmt::format("unexpected '{}' (a transfer ends with 'signal R.I+N' and 'deps a,b,...', each once)",
                                  opt));
        }
      }
      p.queues[static_cast<size_t>(exec)].push_back(std::move(t));
    } else {
      l.fail(at, fmt::format("unknown keyword '{}' (plan, world, tensor, signal, on)", kw));
    }
    if (!l.at_end()) l.fail(l.pos(), fmt::format("unexpected '{}' at the end of the line", l.peek_word()));
  }
  if (!have_world) throw InvalidArgument(fmt::format("{}: no 'world' line", source));
  return p;
}

std::string print_plan(const CommPlan& p) {
  auto check = [](std::string_view what, const std::string& n) {
    WEFT_REQUIRE(valid_name(n), fmt::format("cannot print {} '{}': names are letters, digits, _ . -", what, n));
  };
  auto region = [](const Region& g) {
    return fmt::format("[{}:{},{}:{}]", g.row_begin, g.row_end, g.col_begin, g.col_end);
  };
  auto endpoint = [&](const Endpoint& e) {
    WEFT_REQUIRE(
        e.tensor >= 0 && static_cast<size_t>(e.tensor) < p.tensors.size(),
        fmt::format("cannot print a transfer to tensor {}: the plan has {} tensors", e.tensor, p.tensors.size()));
    return fmt::format("{}:{}{}", e.rank, p.tensors[static_cast<size_t>(e.tensor)].name, region(e.region));
  };
  std::string s = "# weft plan (docs/plan.md)\n";
  if (!p.name.empty()) {
    check("the plan name", p.name);
    s += fmt::format("plan {}\n", p.name);
  }
  s += fmt::format("world {}\n", p.world);
  for (const auto& t : p.tensors) {
    check("tensor", t.name);
    s += fmt::format("tensor {} {}x{} {} elem={}", t.name, t.rows, t.cols, to_string(t.role), t.elem_bytes);
    if (t.sum) s += " sum";
    if (!t.valid_rows.empty()) s += fmt::format(" valid={}", fmt::join(t.valid_rows, ","));
    s += "\n";
  }
  for (const auto& g : p.signals) s += fmt::format("signal {}.{} expect {}\n", g.rank, g.index, g.expected);
  for (size_t r = 0; r < p.queues.size(); ++r)
    for (const auto& t : p.queues[r]) {
      s += fmt::format("on {} chunk {} {} {} {} -> {}", r, t.chunk, to_string(t.kind), to_string(t.engine),
                       endpoint(t.src), endpoint(t.dst));
      if (t.signal.rank >= 0) s += fmt::format(" signal {}.{}+{}", t.signal.rank, t.signal.index, t.increment);
      if (!t.deps.empty()) s += fmt::format(" deps {}", fmt::join(t.deps, ","));
      s += "\n";
    }
  return s;
}

}  // namespace weft::plan
