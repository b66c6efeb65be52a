// The front end's connections: one epoll thread accepts, reads, parses the heads
// and bodies of the requests it answers (queued for the dispatcher,
// serving_step.cc), writes the answers in each connection's order, hands a
// connection whose next request is another kind to the Python server, answers
// 408 to a request that stalls and closes an idle connection.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "serving_front.h"

namespace pyfleet::serving {

namespace {

constexpr size_t kHeadLimit = 64 << 10;   // the Python server answers 431 past it
constexpr size_t kOutLimit = 1 << 20;     // answers not yet read: stop reading past it
constexpr uint64_t kListenTag = uint64_t{1} << 63, kEventTag = ~uint64_t{0};  // | index

}  // namespace

struct Front::Conn {
  int fd = -1;
  uint64_t id = 0;
  std::string in;               // bytes read, not yet taken as requests
  std::deque<RequestPtr> order;  // requests taken, their answers not yet written
  std::string out;              // answers being written
  size_t out_off = 0;
  bool handing_over = false, closing = false;
  bool holds_slot = false;      // a request's head is here, its body is not
  double partial_since = -1;    // when the request being received began
  double idle_since = 0;
  uint32_t events = 0;
};

Front::Front(std::vector<int> listen_fds, StepFn step, AdoptFn adopt, FrontOptions opts)
    : listen_fds_(std::move(listen_fds)), step_(std::move(step)), adopt_(std::move(adopt)),
      opts_(std::move(opts)) {
  metrics_.latency_counts.assign(opts_.latency_bounds.size() + 1, 0);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || event_fd_ < 0) throw std::runtime_error("epoll/eventfd failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (size_t i = 0; i < listen_fds_.size(); ++i) {
    fcntl(listen_fds_[i], F_SETFL, fcntl(listen_fds_[i], F_GETFL) | O_NONBLOCK);
    ev.data.u64 = kListenTag | i;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fds_[i], &ev);
  }
  ev.data.u64 = kEventTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
}

Front::~Front() {
  stop(0);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (event_fd_ >= 0) close(event_fd_);
}

void Front::start() {
  io_thread_ = std::thread([this] { io_loop(); });
  step_thread_ = std::thread([this] { dispatch_loop(); });
}

void Front::stop(double within) {
  if (!io_thread_.joinable()) return;
  accepting_ = false;
  for (int fd : listen_fds_) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  double deadline = now_s() + within;
  while (now_s() < deadline) {  // the requests received are answered and written
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty() && done_.empty() && !step_running_ && in_flight_.load() <= 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stopping_ = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  uint64_t one = 1;
  (void)!write(event_fd_, &one, sizeof one);
  step_thread_.join();
  io_thread_.join();
}

bool Front::try_acquire() {
  int64_t n = in_flight_.load();
  while (n < opts_.max_concurrent)
    if (in_flight_.compare_exchange_weak(n, n + 1)) return true;
  return false;
}

void Front::release() { in_flight_.fetch_sub(1); }

void Front::set_schema(int n_dense, int n_slots, int generation) {
  schema_ = static_cast<uint64_t>(generation) << 32 | static_cast<uint64_t>(n_dense) << 16 |
            static_cast<uint64_t>(n_slots);
}

FrontMetrics Front::metrics() {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  return metrics_;
}

void Front::io_loop() {
  epoll_event events[256];
  double next_sweep = now_s() + 0.25;
  while (!stopping_) {
    int n = epoll_wait(epoll_fd_, events, 256, 250);
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kEventTag) {
        uint64_t v;
        (void)!read(event_fd_, &v, sizeof v);
        drain_done();
      } else if (tag & kListenTag) {
        accept_all(listen_fds_[tag & ~kListenTag]);
      } else {
        auto it = conns_.find(tag);
        if (it == conns_.end()) continue;
        Conn& c = *it->second;
        if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable(c);
        if (conns_.count(tag) && (events[i].events & EPOLLOUT)) flush(c);
      }
    }
    double now = now_s();
    if (now >= next_sweep) {
      sweep(now);
      next_sweep = now + std::min(0.25, opts_.read_timeout / 4);
    }
  }
  drain_done();
  for (auto& [id, c] : conns_) close(c->fd);
  conns_.clear();
  open_conns_ = 0;
}

void Front::accept_all(int listen_fd) {
  while (accepting_) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or an error of that one connection
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = next_id_++;
    c->idle_since = now_s();
    Conn& ref = *c;
    conns_[c->id] = std::move(c);
    open_conns_.fetch_add(1);
    update_events(ref);
  }
}

void Front::update_events(Conn& c) {
  uint32_t want = 0;
  if (!c.handing_over && !c.closing && c.out.size() - c.out_off < kOutLimit) want |= EPOLLIN;
  if (c.out_off < c.out.size()) want |= EPOLLOUT;
  if (want == c.events && c.events != 0) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  epoll_ctl(epoll_fd_, c.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd, &ev);
  c.events = want ? want : EPOLLET;  // (registered, nothing wanted now)
}

void Front::on_readable(Conn& c) {
  char buf[65536];
  for (int rounds = 0; rounds < 4; ++rounds) {
    ssize_t n = read(c.fd, buf, sizeof buf);
    if (n > 0) {
      c.in.append(buf, n);
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    close_conn(c.id);  // the client has gone (or reset)
    return;
  }
  c.idle_since = now_s();
  parse_input(c);
}

void Front::parse_input(Conn& c) {
  size_t off = 0;
  while (!c.handing_over && !c.closing && off < c.in.size()) {
    size_t avail = c.in.size() - off;
    const char* p = c.in.data() + off;
    const char* end = static_cast<const char*>(memmem(p, std::min(avail, kHeadLimit + 4),
                                                      "\r\n\r\n", 4));
    if (end == nullptr) {
      if (avail > kHeadLimit) c.handing_over = true;
      break;
    }
    Head h;
    if (!parse_head(p, end + 4 - p, h) || h.content_length > opts_.max_fast_body) {
      c.handing_over = true;
      break;
    }
    if (!c.holds_slot) {
      if (!try_acquire()) {  // the Python server refuses it (429) by its own count
        c.handing_over = true;
        break;
      }
      c.holds_slot = true;
      receiving_.fetch_add(1);
    }
    if (!take_request(c, h, avail)) break;  // its body is not all here yet
    off += h.length + h.content_length;
  }
  if (off > 0) c.in.erase(0, off);
  if (c.in.empty() || c.handing_over) c.partial_since = -1;
  else if (c.partial_since < 0) c.partial_since = now_s();
  if (c.handing_over && c.order.empty() && c.out_off == c.out.size()) {
    hand_over(c);
    return;
  }
  update_events(c);
}

bool Front::take_request(Conn& c, const Head& h, size_t avail) {
  if (avail < h.length + static_cast<size_t>(h.content_length)) return false;
  auto r = std::make_shared<Request>();
  r->conn_id = c.id;
  r->kind = h.kind;
  r->close = h.close;
  if (h.close) c.closing = true;  // nothing after it is read; closed once answered
  r->t0 = c.partial_since >= 0 ? c.partial_since : now_s();
  size_t at = c.in.size() - avail + h.length;
  r->body.assign(c.in, at, h.content_length);
  if (r->kind == 0) scan_tsv(r->body, *r);
  uint64_t schema = schema_.load();
  int n_dense = (schema >> 16) & 0xffff, n_slots = schema & 0xffff;
  if (r->kind == 1 && schema != 0 && json_to_tsv(r->body, n_dense, n_slots, r->text, r->rows)) {
    r->kind = 2;
    r->fields = n_dense + n_slots;
    r->clean = 1;
    r->schema = static_cast<int>(schema >> 32);
  }
  c.holds_slot = false;
  receiving_.fetch_sub(1);
  c.partial_since = -1;
  c.order.push_back(r);
  int64_t rows = std::max(r->rows, 1);
  std::lock_guard<std::mutex> lk(mu_);
  queue_.push_back(std::move(r));
  queued_rows_ += rows;
  // Wake the dispatcher for its first request, then only once its step can go:
  // every open connection's request here, or the step full.
  if (dispatcher_waiting_ &&
      (gathered_ < 0 || gathered_rows_ + queued_rows_ >= opts_.max_batch_rows ||
       (receiving_.load() == 0 &&
        gathered_ + static_cast<int64_t>(queue_.size()) >= open_conns_.load())))
    cv_.notify_one();
  return true;
}

void Front::flush(Conn& c) {
  while (!c.order.empty() && c.order.front()->ready) {
    c.out += c.order.front()->answer;
    c.order.pop_front();
  }
  bool closing = c.closing && c.order.empty();
  while (c.out_off < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_conn(c.id);
    return;
  }
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
    if (closing) {
      close_conn(c.id);
      return;
    }
    if (c.handing_over && c.order.empty()) {
      hand_over(c);
      return;
    }
  }
  bool could_read = c.events & EPOLLIN;
  update_events(c);
  if (!could_read && (c.events & EPOLLIN) && !c.in.empty()) parse_input(c);
}

void Front::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  drop_slot(c);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  conns_.erase(it);  // its requests in a step are answered to no one
  open_conns_.fetch_sub(1);
}

// A request's head was here, not yet its body: its slot and count given back.
void Front::drop_slot(Conn& c) {
  if (!c.holds_slot) return;
  c.holds_slot = false;
  release();
  receiving_.fetch_sub(1);
}

void Front::hand_over(Conn& c) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  int fd = c.fd;
  std::string data = std::move(c.in);
  drop_slot(c);
  conns_.erase(c.id);
  open_conns_.fetch_sub(1);
  try {
    adopt_(fd, data);  // the Python server owns fd now
  } catch (...) {
    close(fd);
  }
}

void Front::drain_done() {
  std::vector<RequestPtr> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done.swap(done_);
  }
  std::vector<uint64_t> touched;
  for (auto& r : done) {
    r->ready = true;
    if (touched.empty() || touched.back() != r->conn_id) touched.push_back(r->conn_id);
  }
  for (uint64_t id : touched) {
    auto it = conns_.find(id);
    if (it != conns_.end()) flush(*it->second);
  }
}

void Front::refuse_timeout(Conn& c) {
  char what[160];
  bool head = memmem(c.in.data(), c.in.size(), "\r\n\r\n", 4) != nullptr;
  snprintf(what, sizeof what, "the %s did not arrive within --read-timeout %g s\n",
           head ? "body" : "request", opts_.read_timeout);
  std::string text = what;
  double seconds = c.partial_since >= 0 ? now_s() - c.partial_since : -1;
  c.out += head_of("HTTP/1.1 408 Request Timeout\r\n", date_header(),
                   "text/plain; charset=utf-8", "", text.size(), true) + text;
  c.in.clear();
  c.partial_since = -1;
  c.closing = true;
  drop_slot(c);
  count(408, "timeout", head ? seconds : -1);
}

void Front::sweep(double now) {
  std::vector<uint64_t> idle;
  for (auto& [id, cp] : conns_) {
    Conn& c = *cp;
    if (c.closing) continue;
    if (c.partial_since >= 0 && now - c.partial_since >= opts_.read_timeout && c.order.empty()) {
      refuse_timeout(c);
      idle.push_back(id);  // written, then closed (flush)
    } else if (c.in.empty() && c.order.empty() && c.out.empty() &&
               now - c.idle_since >= opts_.keepalive_timeout) {
      c.closing = true;
      idle.push_back(id);
    }
  }
  for (uint64_t id : idle) {
    auto it = conns_.find(id);
    if (it != conns_.end()) flush(*it->second);
  }
}

}  // namespace pyfleet::serving
