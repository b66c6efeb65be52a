// JSON rows of named Criteo columns into the TSV lines the Python server makes of
// them (pyfleet/serving/rows.py, RowSchema._tsv_line), so that they are parsed with
// the step's other rows: {"rows": [{"I1": 3, "C1": "68fd1e64", ...}, ...]}.
// Only the plain form is taken here (numbers, strings without escapes, null, the
// known column names); anything else (the slot form, escapes, booleans, unknown
// columns, invalid JSON) is left to the Python server, which names the problem.
#include <charconv>
#include <cmath>
#include <cstring>

#include "serving_front.h"

namespace pyfleet::serving {

namespace {

struct Reader {
  const char* p;
  const char* e;
  void ws() {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  }
  bool eat(char c) {
    ws();
    if (p < e && *p == c) {
      ++p;
      return true;
    }
    return false;
  }
  // A string without escapes or control characters: [s, s + n).
  bool str(const char*& s, size_t& n) {
    ws();
    if (p >= e || *p != '"') return false;
    s = ++p;
    while (p < e && *p != '"') {
      unsigned char c = static_cast<unsigned char>(*p);
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;  // (non-ASCII: Python decodes)
      ++p;
    }
    if (p >= e) return false;
    n = p - s;
    ++p;
    return true;
  }
};

// The column of a name (I<k>, C<k>, either case), -2 for an ignored one, -1 unknown.
int column_of(const char* s, size_t n, int n_dense, int n_slots) {
  char low[8];
  if (n >= sizeof low) return -1;
  for (size_t i = 0; i < n; ++i) low[i] = (s[i] >= 'A' && s[i] <= 'Z') ? s[i] + 32 : s[i];
  std::string_view v(low, n);
  if (v == "label" || v == "click" || v == "id") return -2;
  if (n < 2 || (low[0] != 'i' && low[0] != 'c') || low[1] == '0') return -1;
  int k = 0;
  for (size_t i = 1; i < n; ++i) {
    if (low[i] < '0' || low[i] > '9') return -1;
    k = k * 10 + (low[i] - '0');
  }
  if (low[0] == 'i') return k >= 1 && k <= n_dense ? k - 1 : -1;
  return k >= 1 && k <= n_slots ? n_dense + k - 1 : -1;
}

bool digits(Reader& r) {
  const char* s = r.p;
  while (r.p < r.e && *r.p >= '0' && *r.p <= '9') ++r.p;
  return r.p > s;
}

// A JSON number (RFC 8259's grammar) at r.p, read past.
bool number(Reader& r, bool& is_float) {
  if (r.p < r.e && *r.p == '-') ++r.p;
  if (r.p < r.e && *r.p == '0') ++r.p;
  else if (!digits(r)) return false;
  if (r.p < r.e && *r.p == '.') {
    ++r.p;
    is_float = true;
    if (!digits(r)) return false;
  }
  if (r.p < r.e && (*r.p == 'e' || *r.p == 'E')) {
    ++r.p;
    is_float = true;
    if (r.p < r.e && (*r.p == '+' || *r.p == '-')) ++r.p;
    if (!digits(r)) return false;
  }
  return true;
}

// One value into `field` as Python writes it (repr of a number, a string as it
// is, "" for null); false: left to Python.
bool value(Reader& r, bool numeric, std::string& field) {
  r.ws();
  if (r.p >= r.e) return false;
  if (*r.p == '"') {
    const char* s;
    size_t n;
    if (numeric || !r.str(s, n)) return false;
    field.assign(s, n);
    return true;
  }
  if (r.e - r.p >= 4 && std::memcmp(r.p, "null", 4) == 0) {
    r.p += 4;
    field.clear();
    return true;
  }
  const char* s = r.p;
  bool is_float = false;
  if (!number(r, is_float)) return false;
  size_t n = r.p - s;
  if (!is_float) {
    if (n == 2 && s[0] == '-' && s[1] == '0') return false;  // Python writes it "0"
    field.assign(s, n);
    return true;
  }
  double d;
  auto res = std::from_chars(s, s + n, d);
  if (res.ec != std::errc() || res.ptr != s + n || !std::isfinite(d)) return false;
  field.clear();
  append_repr(field, d);
  return true;
}

bool row(Reader& r, int n_dense, int n_slots, std::vector<std::string>& fields) {
  for (auto& f : fields) f.clear();
  if (!r.eat('{')) return false;
  if (r.eat('}')) return true;
  do {
    const char* s;
    size_t n;
    if (!r.str(s, n) || !r.eat(':')) return false;
    int j = column_of(s, n, n_dense, n_slots);
    if (j == -1) return false;
    std::string scratch;
    if (!value(r, j >= 0 && j < n_dense, j >= 0 ? fields[j] : scratch)) return false;
  } while (r.eat(','));
  return r.eat('}');
}

}  // namespace

bool json_to_tsv(const std::string& body, int n_dense, int n_slots, std::string& out,
                 int& rows) {
  Reader r{body.data(), body.data() + body.size()};
  const char* s;
  size_t n;
  if (!r.eat('{') || !r.str(s, n) || std::string_view(s, n) != "rows" || !r.eat(':') ||
      !r.eat('['))
    return false;
  std::vector<std::string> fields(n_dense + n_slots);
  rows = 0;
  out.clear();
  if (!r.eat(']')) {
    do {
      if (!row(r, n_dense, n_slots, fields)) return false;
      for (size_t j = 0; j < fields.size(); ++j) {
        if (j) out += '\t';
        out += fields[j];
      }
      out += '\n';
      ++rows;
    } while (r.eat(','));
    if (!r.eat(']')) return false;
  }
  if (!r.eat('}')) return false;
  r.ws();
  return r.p == r.e && rows > 0;
}

}  // namespace pyfleet::serving
