// The native front end of `pyfleet serve`: HTTP/1.1 keep-alive connections on an
// epoll loop (one thread, no Python), single- and few-row prediction requests
// gathered into model steps by a second thread that enters Python once a step.
//
// Only the common request is answered here: `POST /predict HTTP/1.1` with a
// Content-Length body of Criteo TSV lines or JSON (keep-alive or Connection:
// close). A connection whose next request is anything else (another path or
// method, chunked, Expect, HTTP/1.0, a big body, an Accept of npy, malformed HTTP...)
// is handed over, with the bytes read so far, to the Python server, which then
// owns it (the adopt callback): its answers are the Python path's own.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace pyfleet::serving {

// One request the front end answers itself.
struct Request {
  uint64_t conn_id = 0;
  std::string body;      // as sent
  int kind = 0;          // 0: Criteo TSV, 1: JSON, 2: JSON made TSV lines (text)
  std::string text;      // kind 2: the TSV lines of its JSON rows
  int schema = 0;        // kind 2: the generation of the schema it was made by
  int rows = 0;          // TSV: lines (a last line without '\n' counts); JSON: 0
  int fields = 0;        // TSV: tab-separated fields of the first line
  int clean = 0;         // TSV: no CR, no blank line, not empty
  double t0 = 0;         // steady clock seconds at its head
  std::string answer;    // the whole response, once answered
  bool ready = false;    // (I/O thread) its answer may be written
  bool close = false;    // Connection: close (the connection closes after its answer)
};
using RequestPtr = std::shared_ptr<Request>;

// What a model step is given (the requests of the step in order) ...
struct StepIn {
  std::string text;                  // TSV requests' bodies, each ending in '\n'
  std::string raw;                   // every request's body as sent
  std::vector<int64_t> text_ends, raw_ends;
  std::vector<int32_t> info;         // [n, 5]: kind, rows, fields, clean, schema
};

struct StepError {
  size_t index;
  int status;
  std::string status_line;  // "HTTP/1.1 400 Bad Request\r\n"
  std::string text;         // the one line (ending in '\n')
  std::string kind;         // the counters' name of the refusal
};

// ... and what it gives back.
struct StepOut {
  std::vector<double> prob;          // the answered requests' rows, in order
  std::vector<int64_t> counts;       // rows of each request, -1 when refused
  std::vector<StepError> errors;
  std::string prefix, suffix, header;  // an answer's JSON around its numbers; header lines
};

struct FrontOptions {
  double batch_wait = 0.001;
  int64_t max_batch_rows = 4096;
  int64_t max_fast_body = 64 << 10;
  double read_timeout = 30.0;
  double keepalive_timeout = 75.0;
  int64_t max_concurrent = 256;
  std::vector<double> latency_bounds;
};

struct FrontMetrics {
  std::unordered_map<int, int64_t> requests;          // by status
  std::unordered_map<std::string, int64_t> errors;    // by kind
  std::vector<int64_t> latency_counts;                // per bound, then +Inf
  double latency_sum = 0;
};

// Parsed head of a request the front end answers itself.
struct Head {
  size_t length = 0;          // bytes of the request line and headers
  int64_t content_length = -1;
  int kind = -1;              // 0 TSV, 1 JSON
  bool close = false;         // Connection: close
};

// Whether [p, p + n) (ending in CRLF CRLF) is a request this front end answers.
bool parse_head(const char* p, size_t n, Head& head);
// The rows, first line's fields and cleanness of a TSV body.
void scan_tsv(const std::string& body, Request& r);
// JSON rows of named Criteo columns as the TSV lines Python makes of them; false:
// not the plain form (left to Python).
bool json_to_tsv(const std::string& body, int n_dense, int n_slots, std::string& out,
                 int& rows);
// Python's repr() of a double (shortest round trip), appended to out.
void append_repr(std::string& out, double v);
// "Date: ...\r\n" of now.
std::string date_header();
// The head of an answer (status_line ends in CRLF, headers are whole lines).
std::string head_of(const std::string& status_line, const std::string& date,
                    const char* content_type, const std::string& headers, size_t length,
                    bool close);
// Steady clock seconds.
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Front {
 public:
  using StepFn = std::function<void(const StepIn&, StepOut&)>;
  using AdoptFn = std::function<void(int fd, const std::string& data)>;

  Front(std::vector<int> listen_fds, StepFn step, AdoptFn adopt, FrontOptions opts);
  ~Front();
  void start();
  // Stop accepting, answer the requests received (up to `within` seconds),
  // close the connections and join the threads.
  void stop(double within);
  bool try_acquire();
  void release();
  int64_t in_flight() const { return in_flight_.load(); }
  int64_t open_connections() const { return open_conns_.load(); }
  // The columns JSON rows are read with (a model version's), and its generation.
  void set_schema(int n_dense, int n_slots, int generation);
  FrontMetrics metrics();

 private:
  struct Conn;
  void io_loop();
  void dispatch_loop();
  void accept_all(int listen_fd);
  void on_readable(Conn& c);
  void parse_input(Conn& c);
  bool take_request(Conn& c, const Head& h, size_t avail);
  void flush(Conn& c);
  void close_conn(uint64_t id);
  void hand_over(Conn& c);
  void drain_done();
  void sweep(double now);
  void refuse_timeout(Conn& c);
  void update_events(Conn& c);
  bool gather(std::vector<RequestPtr>& items, int64_t& rows);
  void run_step(std::vector<RequestPtr>& items);
  void answer(Request& r, int status, const std::string& text);
  void count(int status, const std::string& kind, double seconds);
  void drop_slot(Conn& c);

  std::vector<int> listen_fds_;
  int epoll_fd_ = -1, event_fd_ = -1;
  StepFn step_;
  AdoptFn adopt_;
  FrontOptions opts_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;  // I/O thread only
  uint64_t next_id_ = 1;
  std::atomic<bool> stopping_{false}, accepting_{true};
  std::atomic<int64_t> in_flight_{0}, open_conns_{0}, receiving_{0};
  std::atomic<uint64_t> schema_{0};  // generation << 32 | n_dense << 16 | n_slots
  std::thread io_thread_, step_thread_;
  std::mutex mu_;  // queue_, done_, dispatcher_waiting_
  std::condition_variable cv_;
  std::deque<RequestPtr> queue_;
  std::vector<RequestPtr> done_;
  bool dispatcher_waiting_ = false;
  int64_t gathered_ = -1;       // requests the waiting dispatcher holds (-1: none yet)
  int64_t gathered_rows_ = 0, queued_rows_ = 0;
  bool step_running_ = false;
  std::mutex metrics_mu_;
  FrontMetrics metrics_;
};

}  // namespace pyfleet::serving
