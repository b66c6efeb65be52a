// The front end's HTTP: the heads it answers itself (strictly: anything it does
// not know is handed to the Python server, whose parser decides), the shape of a
// TSV body, Python's repr of a probability, the Date header.
#include <charconv>
#include <cstring>
#include <ctime>

#include "serving_front.h"

namespace pyfleet::serving {

namespace {

bool is_token(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

std::string lower(const char* p, size_t n) {
  std::string s(p, n);
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

void trim(const char*& p, const char*& e) {
  while (p < e && (*p == ' ' || *p == '\t')) ++p;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t')) --e;
}

// One header of a head; false: not a request answered here.
bool take_header(const char* s, const char* e, Head& h, unsigned& seen) {
  const char* colon = static_cast<const char*>(std::memchr(s, ':', e - s));
  if (colon == nullptr || colon == s) return false;
  for (const char* q = s; q < colon; ++q)
    if (!is_token(static_cast<unsigned char>(*q))) return false;
  const char* v = colon + 1;
  const char* ve = e;
  for (const char* q = v; q < ve; ++q) {
    unsigned char c = static_cast<unsigned char>(*q);
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  trim(v, ve);
  std::string name = lower(s, colon - s);
  auto once = [&seen](unsigned bit) {
    if (seen & bit) return false;
    seen |= bit;
    return true;
  };
  if (name == "content-length") {
    if (!once(1) || v == ve || ve - v > 15) return false;
    int64_t n = 0;
    for (const char* q = v; q < ve; ++q) {
      if (*q < '0' || *q > '9') return false;
      n = n * 10 + (*q - '0');
    }
    h.content_length = n;
  } else if (name == "content-type") {
    if (!once(2)) return false;
    const char* semi = static_cast<const char*>(std::memchr(v, ';', ve - v));
    const char* me = semi ? semi : ve;
    trim(v, me);
    std::string media = lower(v, me - v);
    if (media == "text/tab-separated-values") h.kind = 0;
    else if (media == "application/json") h.kind = 1;
    else return false;
  } else if (name == "connection") {
    if (!once(4)) return false;
    std::string c = lower(v, ve - v);
    if (c == "close") h.close = true;
    else if (c != "keep-alive") return false;
  } else if (name == "accept") {
    if (!once(8) || lower(v, ve - v).find("application/x-npy") != std::string::npos)
      return false;
  } else if (name == "transfer-encoding" || name == "expect" || name == "upgrade") {
    return false;
  }
  return true;
}

}  // namespace

bool parse_head(const char* p, size_t n, Head& h) {
  static const char kLine[] = "POST /predict HTTP/1.1\r\n";
  const size_t line = sizeof(kLine) - 1;
  if (n < line + 2 || std::memcmp(p, kLine, line) != 0) return false;
  h.length = n;
  const char* s = p + line;
  const char* end = p + n - 2;  // the empty line's CRLF
  unsigned seen = 0;
  while (s < end) {
    const char* e = static_cast<const char*>(std::memchr(s, '\r', end - s));
    if (e == nullptr || e + 1 >= p + n || e[1] != '\n') return false;
    if (std::memchr(s, '\n', e - s) != nullptr) return false;  // a bare LF
    if (!take_header(s, e, h, seen)) return false;
    s = e + 2;
  }
  return h.content_length >= 0 && h.kind >= 0;
}

void scan_tsv(const std::string& body, Request& r) {
  const char* p = body.data();
  const char* e = p + body.size();
  const char* nl = static_cast<const char*>(std::memchr(p, '\n', e - p));
  const char* first_end = nl ? nl : e;
  int fields = 1, rows = 0;
  for (const char* q = p; (q = static_cast<const char*>(std::memchr(q, '\t', first_end - q)));
       ++q)
    ++fields;
  for (const char* q = nl; q != nullptr;
       q = static_cast<const char*>(std::memchr(q + 1, '\n', e - q - 1)))
    ++rows;
  if (p < e && e[-1] != '\n') ++rows;
  r.fields = fields;
  r.rows = rows;
  r.clean = p < e && p[0] != '\n' && std::memchr(p, '\r', e - p) == nullptr &&
            body.find("\n\n") == std::string::npos;
}

void append_repr(std::string& out, double v) {
  // Python's repr: the shortest digits that round-trip; exponent form below 1e-4
  // and from 1e16; a float always shows a '.' or an exponent.
  char buf[40];
  double a = v < 0 ? -v : v;
  std::to_chars_result r;
  if (a != 0 && (a < 1e-4 || a >= 1e16))
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  else
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  std::string s(buf, r.ptr);
  auto e = s.find('e');
  if (e != std::string::npos) {  // Python writes e-05, e+16: at least two digits
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    char sign = exp[0] == '-' ? '-' : '+';
    if (exp[0] == '-' || exp[0] == '+') exp = exp.substr(1);
    if (exp.size() < 2) exp = "0" + exp;
    s = mant + "e" + sign + exp;
  } else if (s.find('.') == std::string::npos && s.find("inf") == std::string::npos &&
             s.find("nan") == std::string::npos) {
    s += ".0";
  }
  out += s;
}

std::string date_header() {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  size_t n = std::strftime(buf, sizeof buf, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
  return std::string(buf, n);
}

}  // namespace pyfleet::serving
