#include "megaton/plan/system.h"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"
#include "megaton/plan/shipped_systems.h"

namespace megaton::plan {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllToAll: return "all_to_all";
    case Collective::SendRecv: return "send_recv";
  }
  return "?";
}

const char* memory_op_name(MemoryOp op) {
  switch (op) {
    case MemoryOp::Norm: return "norm";
    case MemoryOp::Activation: return "activation";
    case MemoryOp::Elementwise: return "elementwise";
    case MemoryOp::Embedding: return "embedding";
    case MemoryOp::CrossEntropy: return "cross_entropy";
    case MemoryOp::Rope: return "rope";
    case MemoryOp::Optimizer: return "optimizer";
  }
  return "?";
}

namespace {

// Reads the keys of one TOML table, each at most once, and refuses the ones never asked for.
class TableReader {
 public:
  TableReader(const toml::table& t, std::string where) : t_(t), where_(std::move(where)) {}
  ~TableReader() noexcept(false) {
    if (std::uncaught_exceptions() > 0) return;
    for (const auto& [key, value] : t_)
      if (!read_.count(std::string(key.str())))
        fail(where_, ": unknown key '", std::string(key.str()), "'");
  }
  double number(const std::string& key, double lo, double hi, std::optional<double> fallback = std::nullopt) {
    read_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) {
      if (fallback) return *fallback;
      fail(where_, ": missing key '", key, "'");
    }
    std::optional<double> v = n->value<double>();
    if (!v || !std::isfinite(*v) || *v < lo || *v > hi)
      fail(where_, ": '", key, "' must be a number in [", lo, ", ", hi, "]");
    return *v;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) {
    const double v = number(key, double(lo), double(hi));
    if (v != std::floor(v)) fail(where_, ": '", key, "' must be a whole number");
    return static_cast<int64_t>(v);
  }
  std::string text(const std::string& key, std::optional<std::string> fallback = std::nullopt) {
    read_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) {
      if (fallback) return *fallback;
      fail(where_, ": missing key '", key, "'");
    }
    std::optional<std::string> v = n->value<std::string>();
    if (!v) fail(where_, ": '", key, "' must be a string");
    return *v;
  }
  const toml::table& table(const std::string& key) {
    read_.insert(key);
    const toml::table* sub = t_.get_as<toml::table>(key);
    if (!sub) fail(where_, ": missing table [", key, "]");
    return *sub;
  }
  const toml::array* array(const std::string& key) {
    read_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) return nullptr;
    if (!n->as_array()) fail(where_, ": '", key, "' must be an array of tables ([[", key, "]])");
    return n->as_array();
  }
  const std::string& where() const { return where_; }

 private:
  const toml::table& t_;
  std::string where_;
  std::set<std::string> read_;
};

constexpr double kHuge = 1e30;
const std::set<std::string> kDtypes = {"f32", "bf16", "fp16", "fp8"};

std::string checked_dtype(TableReader& r) {
  std::string d = r.text("dtype");
  if (!kDtypes.count(d)) fail(r.where(), ": dtype '", d, "' is not one of f32, bf16, fp16, fp8");
  return d;
}

// Each table of the array of tables [[key]] (if any), through a reader of its own.
template <typename Read>
void read_points(TableReader& r, const std::string& key, const std::string& origin, Read read) {
  const toml::array* a = r.array(key);
  if (!a) return;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string where = origin + ": " + key + "[" + std::to_string(i) + "]";
    const toml::table* t = (*a)[i].as_table();
    if (!t) fail(where, ": not a table");
    TableReader point(*t, where);
    read(point);
  }
}

LinkSpec read_link(const toml::table& t, const std::string& where) {
  TableReader r(t, where);
  LinkSpec l;
  l.bandwidth_Bps = r.number("bandwidth_Bps", 1e3, kHuge);
  l.latency_s = r.number("latency_s", 0, 10);
  l.busy_send_delay_s = r.number("busy_send_delay_s", 0, 10, 0.0);
  TableReader e(r.table("efficiency"), where + ".efficiency");
  for (Collective c : kCollectives) l.efficiency[c] = e.number(collective_name(c), 1e-4, 1.0);
  return l;
}

// Inverse-distance weighting in log space over the points `dist` measures; a point at distance 0
// returns its own value.
template <typename P, typename Dist, typename Value>
double idw(const std::vector<P>& points, Dist dist, Value value, const char* what, const std::string& dtype,
           const std::string& system) {
  double num = 0, den = 0;
  bool any = false;
  for (const P& p : points) {
    if (p.dtype != dtype) continue;
    any = true;
    const double d = dist(p);
    if (d < 1e-12) return value(p);
    const double w = 1.0 / (d * d * d * d);  // steep: the nearest shapes dominate
    num += w * value(p);
    den += w;
  }
  if (!any) fail("system '", system, "' has no ", what, " efficiency for dtype ", dtype);
  return num / den;
}

double log_gap(double a, double b) { return std::log2(a) - std::log2(b); }

}  // namespace

double SystemSpec::peak(const std::string& dtype) const {
  auto it = peak_flops.find(dtype);
  if (it == peak_flops.end()) fail("system '", name, "' gives no peak_flops for dtype ", dtype);
  return it->second;
}

namespace {
// x clamped to the range of `coord` over the points of `dtype`: beyond the table the nearest edge's
// figure holds (a bigger GEMM than any measured is taken as efficient as the biggest).
template <typename P, typename Coord>
double clamped(const std::vector<P>& points, const std::string& dtype, double x, Coord coord) {
  double lo = std::numeric_limits<double>::max(), hi = 0;
  for (const P& p : points)
    if (p.dtype == dtype) {
      lo = std::min(lo, double(coord(p)));
      hi = std::max(hi, double(coord(p)));
    }
  return hi > 0 ? std::clamp(x, lo, hi) : x;
}
}  // namespace

double SystemSpec::gemm_efficiency(const std::string& dtype, int64_t m, int64_t n, int64_t k) const {
  const double cm = clamped(gemm, dtype, double(m), [](const GemmPoint& p) { return p.m; });
  const double cn = clamped(gemm, dtype, double(n), [](const GemmPoint& p) { return p.n; });
  const double ck = clamped(gemm, dtype, double(k), [](const GemmPoint& p) { return p.k; });
  return idw(
      gemm,
      [&](const GemmPoint& p) {
        const double a = log_gap(cm, double(p.m)), b = log_gap(cn, double(p.n)), c = log_gap(ck, double(p.k));
        return std::sqrt(a * a + b * b + c * c);
      },
      [](const GemmPoint& p) { return p.efficiency; }, "GEMM", dtype, name);
}

double SystemSpec::attention_efficiency(const std::string& dtype, int64_t seq, int64_t head_dim, bool backward) const {
  const double cs = clamped(attention, dtype, double(seq), [](const AttentionPoint& p) { return p.seq; });
  const double cd = clamped(attention, dtype, double(head_dim), [](const AttentionPoint& p) { return p.head_dim; });
  return idw(
      attention,
      [&](const AttentionPoint& p) {
        const double a = log_gap(cs, double(p.seq)), b = log_gap(cd, double(p.head_dim));
        return std::sqrt(a * a + b * b);
      },
      [&](const AttentionPoint& p) { return backward ? p.backward : p.forward; }, "attention", dtype, name);
}

SystemSpec parse_system(const std::string& text, const std::string& origin) {
  toml::table doc;
  try {
    doc = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    fail(origin, ": not valid TOML: ", e.description());
  }
  SystemSpec s;
  TableReader r(doc, origin);
  s.name = r.text("name");
  s.source = r.text("source");
  if (s.source != "datasheet" && s.source != "calibrated")
    fail(origin, ": 'source' must be \"datasheet\" or \"calibrated\", not '", s.source, "'");
  s.description = r.text("description", "");
  s.devices_per_node = r.integer("devices_per_node", 1, 1 << 20);
  s.memory_bytes = r.number("memory_bytes", 1e6, kHuge);
  s.op_overhead_s = r.number("op_overhead_s", 0, 1);
  {
    const toml::table& t = r.table("peak_flops");
    TableReader p(t, origin + ": [peak_flops]");
    for (const std::string& d : kDtypes)
      if (t.get(d)) s.peak_flops[d] = p.number(d, 1e6, kHuge);
    if (s.peak_flops.empty()) fail(origin, ": [peak_flops] gives no dtype (f32, bf16, fp16, fp8)");
  }
  read_points(r, "gemm", origin, [&](TableReader& g) {
    s.gemm.push_back({checked_dtype(g), g.integer("m", 1, int64_t{1} << 40), g.integer("n", 1, int64_t{1} << 40),
                      g.integer("k", 1, int64_t{1} << 40), g.number("efficiency", 1e-5, 1.0)});
  });
  read_points(r, "attention", origin, [&](TableReader& g) {
    s.attention.push_back({checked_dtype(g), g.integer("seq", 1, int64_t{1} << 30), g.integer("head_dim", 1, 1 << 16),
                           g.number("forward", 1e-5, 1.0), g.number("backward", 1e-5, 1.0)});
  });
  for (const auto& [dtype, peak] : s.peak_flops) {
    bool has = false;
    for (const GemmPoint& p : s.gemm) has = has || p.dtype == dtype;
    if (!has) fail(origin, ": peak_flops gives ", dtype, " but no [[gemm]] entry has dtype ", dtype);
  }
  {
    TableReader m(r.table("memory"), origin + ": [memory]");
    s.memory_bandwidth_Bps = m.number("bandwidth_Bps", 1e6, kHuge);
    TableReader e(m.table("efficiency"), origin + ": [memory.efficiency]");
    for (MemoryOp op : kMemoryOps) s.memory_efficiency[op] = e.number(memory_op_name(op), 1e-4, 1.0);
  }
  {
    TableReader n(r.table("network"), origin + ": [network]");
    s.intra_node = read_link(n.table("intra_node"), origin + ": [network.intra_node]");
    s.inter_node = read_link(n.table("inter_node"), origin + ": [network.inter_node]");
  }
  return s;
}

SystemSpec load_system(const std::string& path) { return parse_system(read_regular_file(path, "system file"), path); }

namespace {
// The shortest text that reads back as the same double.
std::string num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
// A TOML basic string (JSON's escapes are TOML's).
std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }
void write_link(std::ostringstream& os, const char* name, const LinkSpec& l) {
  os << "\n[network." << name << "]\nbandwidth_Bps = " << num(l.bandwidth_Bps) << "\nlatency_s = " << num(l.latency_s)
     << "\nbusy_send_delay_s = " << num(l.busy_send_delay_s) << "\n[network." << name << ".efficiency]\n";
  for (Collective c : kCollectives) os << collective_name(c) << " = " << num(l.efficiency.at(c)) << "\n";
}
}  // namespace

std::string to_toml(const SystemSpec& s) {
  std::ostringstream os;
  os << "name = " << quoted(s.name) << "\nsource = " << quoted(s.source) << "\ndescription = " << quoted(s.description)
     << "\ndevices_per_node = " << s.devices_per_node << "\nmemory_bytes = " << num(s.memory_bytes)
     << "\nop_overhead_s = " << num(s.op_overhead_s) << "\n\n[peak_flops]\n";
  for (const auto& [d, v] : s.peak_flops) os << d << " = " << num(v) << "\n";
  os << "\n[memory]\nbandwidth_Bps = " << num(s.memory_bandwidth_Bps) << "\n[memory.efficiency]\n";
  for (MemoryOp op : kMemoryOps) os << memory_op_name(op) << " = " << num(s.memory_efficiency.at(op)) << "\n";
  write_link(os, "intra_node", s.intra_node);
  write_link(os, "inter_node", s.inter_node);
  for (const GemmPoint& p : s.gemm)
    os << "\n[[gemm]]\ndtype = " << quoted(p.dtype) << "\nm = " << p.m << "\nn = " << p.n << "\nk = " << p.k
       << "\nefficiency = " << num(p.efficiency) << "\n";
  for (const AttentionPoint& p : s.attention)
    os << "\n[[attention]]\ndtype = " << quoted(p.dtype) << "\nseq = " << p.seq << "\nhead_dim = " << p.head_dim
       << "\nforward = " << num(p.forward) << "\nbackward = " << num(p.backward) << "\n";
  return os.str();
}

SystemSpec resolve_system(const std::string& path_or_name) {
  if (std::filesystem::exists(path_or_name)) return load_system(path_or_name);
  if (std::optional<SystemSpec> s = shipped_system(path_or_name)) return *s;
  std::string names;
  for (const std::string& n : shipped_system_names()) names += (names.empty() ? "" : ", ") + n;
  fail("system '", path_or_name, "' is neither a file nor a shipped system (shipped: ", names, ")");
}

}  // namespace megaton::plan
