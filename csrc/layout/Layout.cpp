#include "layout/Layout.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>

#include "common/Check.h"

namespace hotswitch {

const char* axisName(Axis axis) {
  switch (axis) {
    case Axis::kTp: return "tp";
    case Axis::kCp: return "cp";
    case Axis::kDp: return "dp";
    case Axis::kPp: return "pp";
  }
  return "?";
}

namespace {

bool axisFromName(const std::string& name, Axis* out) {
  for (int a = 0; a < kNumAxes; ++a) {
    if (name == axisName(static_cast<Axis>(a))) {
      *out = static_cast<Axis>(a);
      return true;
    }
  }
  return false;
}

}  // namespace

Layout::Layout(int dp, int tp, int pp, int cp, Order order) : order_(order) {
  degrees_[static_cast<int>(Axis::kDp)] = dp;
  degrees_[static_cast<int>(Axis::kTp)] = tp;
  degrees_[static_cast<int>(Axis::kPp)] = pp;
  degrees_[static_cast<int>(Axis::kCp)] = cp;
  for (int a = 0; a < kNumAxes; ++a) {
    HS_CHECK(degrees_[a] >= 1, axisName(static_cast<Axis>(a)), " degree must be >= 1, got ",
             degrees_[a]);
  }
  // The world is an int: reject degrees whose product does not fit before anything
  // multiplies them.
  int64_t world = 1;
  for (int a = 0; a < kNumAxes; ++a) {
    world *= degrees_[a];
    HS_CHECK(world <= std::numeric_limits<int>::max(), "dp(", dp, ") * tp(", tp, ") * pp(", pp, ") * cp(", cp,
             ") exceeds the largest world (", std::numeric_limits<int>::max(), ")");
  }
  std::array<bool, kNumAxes> seen{};
  for (Axis axis : order) {
    int a = static_cast<int>(axis);
    HS_CHECK(a >= 0 && a < kNumAxes && !seen[a], "rank order must name each of tp, cp, dp, pp ",
             "once, got ", orderName());
    seen[a] = true;
  }
}

Layout::Order Layout::parseOrder(const std::string& text) {
  Order order{};
  size_t pos = 0;
  int n = 0;
  while (pos <= text.size()) {
    size_t next = text.find('-', pos);
    std::string part = text.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    Axis axis;
    HS_CHECK(n < kNumAxes && axisFromName(part, &axis), "rank order '", text,
             "' is not a '-'-separated permutation of tp, cp, dp, pp");
    order[n++] = axis;
    if (next == std::string::npos) {
      break;
    }
    pos = next + 1;
  }
  HS_CHECK(n == kNumAxes, "rank order '", text, "' names ", n, " axes, expected 4 (tp, cp, dp, pp)");
  std::array<bool, kNumAxes> seen{};
  for (Axis axis : order) {
    HS_CHECK(!seen[static_cast<int>(axis)], "rank order '", text, "' names ", axisName(axis),
             " twice");
    seen[static_cast<int>(axis)] = true;
  }
  return order;
}

Layout Layout::parse(const std::string& text) {
  std::string degreesText = text;
  Order order = megatronOrder();
  size_t slash = text.find('/');
  if (slash != std::string::npos) {
    degreesText = text.substr(0, slash);
    order = parseOrder(text.substr(slash + 1));
  }
  std::array<int, kNumAxes> degrees{1, 1, 1, 1};
  std::array<bool, kNumAxes> seen{};
  size_t pos = 0;
  HS_CHECK(!degreesText.empty(), "layout '", text, "' is empty; expected e.g. 'dp2tp4'");
  while (pos < degreesText.size()) {
    Axis axis;
    HS_CHECK(pos + 2 <= degreesText.size() && axisFromName(degreesText.substr(pos, 2), &axis),
             "layout '", text, "' is not a sequence of <axis><degree> with axes dp, tp, pp, cp ",
             "(e.g. 'dp2tp4')");
    pos += 2;
    size_t digits = pos;
    while (digits < degreesText.size() && std::isdigit(static_cast<unsigned char>(degreesText[digits]))) {
      ++digits;
    }
    HS_CHECK(digits > pos && digits - pos <= 6, "layout '", text, "': ", axisName(axis),
             " needs a degree (e.g. '", axisName(axis), "2')");
    int a = static_cast<int>(axis);
    HS_CHECK(!seen[a], "layout '", text, "' names ", axisName(axis), " twice");
    seen[a] = true;
    degrees[a] = std::stoi(degreesText.substr(pos, digits - pos));
    pos = digits;
  }
  return Layout(degrees[static_cast<int>(Axis::kDp)], degrees[static_cast<int>(Axis::kTp)],
                degrees[static_cast<int>(Axis::kPp)], degrees[static_cast<int>(Axis::kCp)], order);
}

std::vector<Layout> Layout::enumerate(int world, int maxCp) {
  HS_CHECK(world >= 1, "world must be >= 1, got ", world);
  HS_CHECK(maxCp >= 1, "max_cp must be >= 1, got ", maxCp);
  std::vector<Layout> out;
  for (int cp = 1; cp <= std::min(world, maxCp); ++cp) {
    if (world % cp) continue;
    const int rest = world / cp;
    for (int pp = 1; pp <= rest; ++pp) {
      if (rest % pp) continue;
      for (int tp = 1; tp <= rest / pp; ++tp) {
        if ((rest / pp) % tp) continue;
        out.emplace_back(rest / pp / tp, tp, pp, cp);
      }
    }
  }
  return out;
}

int Layout::world() const {
  return degrees_[0] * degrees_[1] * degrees_[2] * degrees_[3];
}

void Layout::validate(int world) const {
  HS_CHECK(this->world() == world, "dp(", dp(), ") * tp(", tp(), ") * pp(", pp(), ") * cp(", cp(),
           ") = ", this->world(), " != world(", world, ")");
}

Coord Layout::coord(int rank) const {
  HS_CHECK(rank >= 0 && rank < world(), "rank ", rank, " outside layout ", name(), " of world ",
           world());
  Coord c{};
  for (Axis axis : order_) {
    int d = degree(axis);
    c[static_cast<int>(axis)] = rank % d;
    rank /= d;
  }
  return c;
}

int Layout::rank(const Coord& c) const {
  int r = 0;
  for (int i = kNumAxes - 1; i >= 0; --i) {
    Axis axis = order_[i];
    int a = static_cast<int>(axis);
    HS_CHECK(c[a] >= 0 && c[a] < degree(axis), axisName(axis), " coordinate ", c[a],
             " outside [0, ", degree(axis), ")");
    r = r * degree(axis) + c[a];
  }
  return r;
}

std::vector<int> Layout::group(Axis axis, int rank) const {
  Coord c = coord(rank);
  std::vector<int> out;
  for (int i = 0; i < degree(axis); ++i) {
    c[static_cast<int>(axis)] = i;
    out.push_back(this->rank(c));
  }
  return out;
}

std::vector<std::vector<int>> Layout::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world(); ++r) {
    if (coord(r)[static_cast<int>(axis)] == 0) {
      out.push_back(group(axis, r));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int Layout::dataIndex(int rank) const {
  Coord c = coord(rank);
  return c[static_cast<int>(Axis::kDp)] * cp() + c[static_cast<int>(Axis::kCp)];
}

std::vector<int> Layout::dataGroup(int rank) const {
  Coord c = coord(rank);
  std::vector<int> out(dataSize());
  for (int d = 0; d < dp(); ++d) {
    for (int k = 0; k < cp(); ++k) {
      c[static_cast<int>(Axis::kDp)] = d;
      c[static_cast<int>(Axis::kCp)] = k;
      out[d * cp() + k] = this->rank(c);
    }
  }
  return out;
}

std::string Layout::orderName() const {
  std::string out;
  for (int i = 0; i < kNumAxes; ++i) {
    out += (i ? "-" : "");
    out += axisName(order_[i]);
  }
  return out;
}

std::string Layout::name() const {
  std::string out;
  for (Axis axis : {Axis::kDp, Axis::kTp, Axis::kPp, Axis::kCp}) {
    if (degree(axis) > 1) {
      out += str(axisName(axis), degree(axis));
    }
  }
  if (out.empty()) {
    out = "dp1";
  }
  if (order_ != megatronOrder()) {
    out += "/" + orderName();
  }
  return out;
}

}  // namespace hotswitch
