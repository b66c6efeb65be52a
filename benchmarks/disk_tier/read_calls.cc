// What a spilled row's read costs by call: random 232-byte records (a slot
// of bench_capacity's table) anywhere in a file in the page cache, one
// preadv2(RWF_NOWAIT) a record as internal/spill_file.h reads them, against the same
// reads submitted to io_uring CHUNK at a time (raw syscalls: liburing is not
// on the package index). With MIB > 0, MIB MiB of memory are touched before
// each CHUNK records, out of the timing. A file smaller than the last-level
// cache (480 MiB on the machine of docs/dev/disk_tier_log.md) stays in it after it is
// written, and its reads cost a quarter of the table's: use a file several
// times larger than that cache, or read another such file first.
//
//   head -c 4G /dev/urandom > /tmp/records.bin
//   g++ -O2 -std=c++17 -o /tmp/read_calls benchmarks/disk_tier/read_calls.cc
//   /tmp/read_calls /tmp/records.bin [CHUNK=256] [MIB=0]
//
// Prints CPU and wall ns a record for each, three rounds of 100 x 6,400, and
// the reads RWF_NOWAIT refused (not in the page cache: "short"); then the
// same reads from the file mapped (MADV_POPULATE_READ, kernel 5.14 or later),
// with the process's RSS, which the mapped file's pages join.
#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>
#include <random>
#include <atomic>

static double cpu() { timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long rss_mib() {
  long pages = 0, rss = 0;
  if (FILE *f = fopen("/proc/self/statm", "r")) { if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0; fclose(f); }
  return rss * sysconf(_SC_PAGESIZE) >> 20;
}
static double wall() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

struct Ring {
  int fd; unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  io_uring_sqe *sqes; io_uring_cqe *cqes; unsigned entries;
};
static int setup(Ring &r, unsigned entries, unsigned flags) {
  io_uring_params p; memset(&p, 0, sizeof p); p.flags = flags;
  int fd = syscall(__NR_io_uring_setup, entries, &p);
  if (fd < 0) { perror("io_uring_setup"); return -1; }
  r.fd = fd; r.entries = p.sq_entries;
  size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  if (p.features & IORING_FEAT_SINGLE_MMAP) sq_sz = cq_sz = std::max(sq_sz, cq_sz);
  char *sq = (char*)mmap(0, sq_sz, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_POPULATE, fd, IORING_OFF_SQ_RING);
  char *cq = (p.features & IORING_FEAT_SINGLE_MMAP) ? sq :
    (char*)mmap(0, cq_sz, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_POPULATE, fd, IORING_OFF_CQ_RING);
  r.sqes = (io_uring_sqe*)mmap(0, p.sq_entries*sizeof(io_uring_sqe), PROT_READ|PROT_WRITE, MAP_SHARED|MAP_POPULATE, fd, IORING_OFF_SQES);
  r.sq_head=(unsigned*)(sq+p.sq_off.head); r.sq_tail=(unsigned*)(sq+p.sq_off.tail);
  r.sq_mask=(unsigned*)(sq+p.sq_off.ring_mask); r.sq_array=(unsigned*)(sq+p.sq_off.array);
  r.cq_head=(unsigned*)(cq+p.cq_off.head); r.cq_tail=(unsigned*)(cq+p.cq_off.tail);
  r.cq_mask=(unsigned*)(cq+p.cq_off.ring_mask); r.cqes=(io_uring_cqe*)(cq+p.cq_off.cqes);
  for (unsigned i = 0; i < r.entries; ++i) r.sq_array[i] = i;
  return 0;
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "/tmp/records.bin";
  size_t slot = 232, batch = 6400; int reps = 100;
  unsigned chunk = argc > 2 ? atoi(argv[2]) : 256;
  int fd = open(path, O_RDONLY | O_NOATIME);
  if (fd < 0) { perror("open"); return 1; }
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size < slot) { fprintf(stderr, "%s: too small\n", path); return 1; }
  const size_t nslots = st.st_size / slot;  // records anywhere in the file
  std::mt19937_64 g(1);
  std::vector<uint64_t> off(batch);
  std::vector<char> buf(batch * slot);
  Ring r; if (setup(r, chunk, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN) < 0) return 1;
  std::vector<char> trash((size_t)(argc > 3 ? atoi(argv[3]) : 0) << 20);
  auto thrash = [&] { for (size_t i = 0; i < trash.size(); i += 64) trash[i]++; };
  const char *map = (const char *)mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) { perror("mmap"); return 1; }
  madvise((void *)map, st.st_size, MADV_POPULATE_READ);
  for (int round = 0; round < 3; ++round) {
    // preadv2 loop
    double c0 = cpu(), w0 = wall(); long bad = 0;
    for (int k = 0; k < reps; ++k) {
      for (auto &o : off) o = (g() % nslots) * slot;
      for (size_t i = 0; i < batch; ++i) {
        if (i % chunk == 0) { double t = cpu(); thrash(); c0 += cpu() - t; }
        iovec v{buf.data() + i * slot, slot};
        if (preadv2(fd, &v, 1, off[i], RWF_NOWAIT) != (ssize_t)slot) ++bad;
      }
    }
    double pc = cpu() - c0, pw = wall() - w0;
    // io_uring
    c0 = cpu(); w0 = wall(); long ubad = 0;
    for (int k = 0; k < reps; ++k) {
      for (auto &o : off) o = (g() % nslots) * slot;
      for (size_t i = 0; i < batch; i += chunk) {
        { double t = cpu(); thrash(); c0 += cpu() - t; }
        unsigned n = std::min<size_t>(chunk, batch - i);
        unsigned tail = *r.sq_tail;
        for (unsigned j = 0; j < n; ++j) {
          io_uring_sqe *s = &r.sqes[(tail + j) & *r.sq_mask];
          memset(s, 0, sizeof *s);
          s->opcode = IORING_OP_READ; s->fd = fd; s->off = off[i + j];
          s->addr = (uint64_t)(buf.data() + (i + j) * slot); s->len = slot;
          s->rw_flags = RWF_NOWAIT; s->user_data = i + j;
        }
        __atomic_store_n(r.sq_tail, tail + n, __ATOMIC_RELEASE);
        int rc = syscall(__NR_io_uring_enter, r.fd, n, n, IORING_ENTER_GETEVENTS, nullptr, 0);
        if (rc < 0) { perror("enter"); return 1; }
        unsigned head = *r.cq_head, ct = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
        for (; head != ct; ++head) if (r.cqes[head & *r.cq_mask].res != (int)slot) ++ubad;
        __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
      }
    }
    double uc = cpu() - c0, uw = wall() - w0;
    // The file mapped instead (mapped and populated once, outside the
    // timing): a record is a copy from the mapping, the records kAhead on
    // prefetched, so their misses overlap, which one call a record cannot.
    // The mapped pages count in the process's RSS (printed).
    constexpr size_t kAhead = 8;
    c0 = cpu();
    for (int k = 0; k < reps; ++k) {
      for (auto &o : off) o = (g() % nslots) * slot;
      for (size_t i = 0; i < batch; ++i) {
        if (i % chunk == 0) { double t = cpu(); thrash(); c0 += cpu() - t; }
        if (i + kAhead < batch) {
          for (size_t b = 0; b < slot; b += 64) __builtin_prefetch(map + off[i + kAhead] + b);
          __builtin_prefetch(map + off[i + kAhead] + slot - 1);
        }
        memcpy(buf.data() + i * slot, map + off[i], slot);
      }
    }
    double mc = cpu() - c0;
    double rows = double(reps) * batch;
    printf("%zu MiB, chunk %u: preadv2 %.0f ns/row cpu (%.0f wall, %ld short) | io_uring %.0f ns/row cpu (%.0f wall, %ld short) | ratio %.2f"
           " | mapped %.0f ns/row cpu, RSS %ld MiB\n",
           (size_t)(st.st_size >> 20), chunk, pc / rows * 1e9, pw / rows * 1e9, bad, uc / rows * 1e9, uw / rows * 1e9, ubad, uc / pc,
           mc / rows * 1e9, rss_mib());
  }
}
