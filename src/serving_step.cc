// The front end's model steps: the dispatcher thread gathers the queued requests
// (waiting up to batch_wait for the other open connections' requests, as the
// Python batcher does), gives them to the step function in one call, writes each
// request's answer and passes them to the I/O thread (an eventfd wakes it).
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "serving_front.h"

namespace pyfleet::serving {

std::string head_of(const std::string& status_line, const std::string& date,
                    const char* content_type, const std::string& headers, size_t length,
                    bool close) {
  std::string h = status_line;
  h += date;
  h += "Content-Type: ";
  h += content_type;
  h += "\r\n";
  h += headers;
  h += "Content-Length: ";
  h += std::to_string(length);
  h += close ? "\r\nConnection: close\r\n\r\n" : "\r\n\r\n";
  return h;
}

bool Front::gather(std::vector<RequestPtr>& items, int64_t& rows) {
  while (!queue_.empty()) {
    int64_t n = std::max(queue_.front()->rows, 1);
    if (!items.empty() && rows + n > opts_.max_batch_rows) return true;
    items.push_back(std::move(queue_.front()));
    queue_.pop_front();
    queued_rows_ -= n;
    rows += n;
  }
  return rows >= opts_.max_batch_rows;
}

void Front::dispatch_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    dispatcher_waiting_ = true;
    cv_.wait(lk, [this] { return !queue_.empty() || stopping_; });
    dispatcher_waiting_ = false;
    if (queue_.empty()) break;  // stopping
    std::vector<RequestPtr> items;
    int64_t rows = 0;
    bool full = gather(items, rows);
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(opts_.batch_wait));
    // Wait a little for the requests of the other clients: bodies being received,
    // and the other open connections (one request at a time each), whose last
    // answers are being written now.
    while (!full && !stopping_ &&
           (receiving_.load() > 0 || static_cast<int64_t>(items.size()) < open_conns_.load())) {
      dispatcher_waiting_ = true;
      gathered_ = static_cast<int64_t>(items.size());
      gathered_rows_ = rows;
      bool timed_out = cv_.wait_until(lk, deadline) == std::cv_status::timeout;
      dispatcher_waiting_ = false;
      gathered_ = -1;
      full = gather(items, rows);
      if (timed_out) break;
    }
    step_running_ = true;
    lk.unlock();
    run_step(items);
    lk.lock();
    step_running_ = false;
    for (auto& r : items) done_.push_back(std::move(r));
    uint64_t one = 1;
    (void)!write(event_fd_, &one, sizeof one);
  }
}

void Front::run_step(std::vector<RequestPtr>& items) {
  StepIn in;
  in.info.reserve(items.size() * 5);
  for (auto& r : items) {
    if (r->kind == 0) {
      in.text += r->body;
      if (r->body.empty() || r->body.back() != '\n') in.text += '\n';
    } else if (r->kind == 2) {
      in.text += r->text;
    }
    in.raw += r->body;
    in.text_ends.push_back(static_cast<int64_t>(in.text.size()));
    in.raw_ends.push_back(static_cast<int64_t>(in.raw.size()));
    in.info.insert(in.info.end(), {r->kind, r->rows, r->fields, r->clean, r->schema});
  }
  StepOut out;
  try {
    step_(in, out);
  } catch (const std::exception& e) {
    for (auto& r : items) answer(*r, 500, std::string("the server failed: ") + e.what());
    return;
  }
  if (out.counts.size() != items.size()) {
    for (auto& r : items) answer(*r, 500, "the server failed: a step answered no rows");
    return;
  }
  std::vector<StepError*> error_of(items.size(), nullptr);
  for (auto& e : out.errors)
    if (e.index < items.size()) error_of[e.index] = &e;
  std::string date = date_header();
  size_t a = 0;
  std::string body;
  for (size_t i = 0; i < items.size(); ++i) {
    Request& r = *items[i];
    double seconds = now_s() - r.t0;
    if (error_of[i] != nullptr) {
      StepError& e = *error_of[i];
      r.answer = head_of(e.status_line, date, "text/plain; charset=utf-8", "", e.text.size(),
                         r.close) + e.text;
      count(e.status, e.kind, seconds);
      continue;
    }
    int64_t n = out.counts[i];
    body = out.prefix;
    for (int64_t k = 0; k < n && a < out.prob.size(); ++k, ++a) {
      if (k) body += ", ";
      append_repr(body, out.prob[a]);
    }
    body += out.suffix;
    r.answer = head_of("HTTP/1.1 200 OK\r\n", date, "application/json; charset=utf-8",
                       out.header, body.size(), r.close) + body;
    count(200, "", seconds);
  }
  for (size_t i = 0; i < items.size(); ++i) release();
}

void Front::answer(Request& r, int status, const std::string& text) {
  std::string line = text;
  for (auto& ch : line)
    if (ch == '\n' || ch == '\r') ch = ' ';
  line += '\n';
  r.answer = head_of(status == 500 ? "HTTP/1.1 500 Internal Server Error\r\n"
                                   : "HTTP/1.1 " + std::to_string(status) + " Error\r\n",
                     date_header(), "text/plain; charset=utf-8", "", line.size(), r.close) +
             line;
  count(status, status == 500 ? "server" : "model", now_s() - r.t0);
  release();
}

void Front::count(int status, const std::string& kind, double seconds) {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  metrics_.requests[status] += 1;
  if (status >= 400) metrics_.errors[kind.empty() ? std::to_string(status) : kind] += 1;
  if (seconds >= 0) {  // prediction requests answered (a 408 is not timed: no answer time)
    auto& b = opts_.latency_bounds;
    size_t i = std::lower_bound(b.begin(), b.end(), seconds) - b.begin();
    metrics_.latency_counts[i] += 1;
    metrics_.latency_sum += seconds;
  }
}

}  // namespace pyfleet::serving
