// Cache admission of a batch, FBGEMM-style: the ids of each table are deduplicated once, all
// unique rows are looked up in the cache (hits touched and locked), then the misses take
// the least recently / frequently used way of their set that no row of this batch (or of
// a batch still waiting for its backward) holds. A miss whose set has no such way stays
// uncached for this batch, and so does one with fewer samples in the batch than the
// table's admission count unless that way is empty: a row seen once is read and updated in
// the store instead of evicting a row that may be hot. Then one pass over the list of
// admissions, known in full, writes each victim back (stochastic rounding) and loads the new
// row, its DRAM accesses requested ahead so their latencies overlap.
// Mirrors kernels/reference.py's admit operation by operation.
#include <algorithm>

#include "ops.h"
#include "profile.h"

namespace sslrec {

namespace {

inline uint8_t plru_touch(uint8_t bits, int way) {
  int node = 0;
  for (int level = 0; level < 3; ++level) {
    const int right = (way >> (2 - level)) & 1;
    bits = static_cast<uint8_t>((bits & ~(1 << node)) | ((1 - right) << node));
    node = 2 * node + 1 + right;
  }
  return bits;
}

// The tree's victim, turning away from any subtree whose ways are all locked.
inline int plru_victim(uint8_t bits, uint8_t locked) {
  int node = 0, lo = 0, width = kWays;
  for (int level = 0; level < 3; ++level) {
    int right = (bits >> node) & 1;
    width >>= 1;
    const int mask = ((1 << width) - 1) << (lo + right * width);
    if ((locked & mask) == mask) right ^= 1;
    lo += right * width;
    node = 2 * node + 1 + right;
  }
  return lo;
}

inline void touch(const TableView& t, int64_t s, int way, bool fresh) {
  if (t.policy == 0) {
    t.state[s] = plru_touch(t.state[s], way);
    return;
  }
  uint8_t* cnt = t.state + s * kWays;
  if (fresh) {
    cnt[way] = 1;
    return;
  }
  if (cnt[way] >= kLfuMax)  // aging keeps counts bounded and lets old favourites go
    for (int w = 0; w < kWays; ++w) cnt[w] = cnt[w] / 2;
  cnt[way] += 1;
}

// The first empty unlocked way of set s, or -1.
inline int empty_way(const TableView& t, int64_t s, uint8_t locked) {
  const uint32_t empty = t.ways_tagged_and_empty(s, -1) >> 8;
  const uint32_t free_ways = empty & ~static_cast<uint32_t>(locked);
  return free_ways ? __builtin_ctz(free_ways) : -1;
}

// Way of set s a miss takes: the first empty unlocked way, else the policy's choice among
// the unlocked ways; -1 when all are locked.
inline int victim(const TableView& t, int64_t s, uint8_t locked) {
  if (locked == 0xFF) return -1;
  const int empty = empty_way(t, s, locked);
  if (empty >= 0) return empty;
  if (t.policy == 0) return plru_victim(t.state[s], locked);
  const uint8_t* cnt = t.state + s * kWays;
  int best = -1;
  for (int w = 0; w < kWays; ++w)
    if (!((locked >> w) & 1) && (best < 0 || cnt[w] < cnt[best])) best = w;
  return best;
}

// Unique rows of table f's ids (`col`, the table's column, contiguous) in first-occurrence
// order, each sample's index among them and each row's number of samples. Returns U. An
// open-addressing table of (row, index) entries, twice the batch in size and left empty for
// the next call; `Row` is uint32_t when every row id fits (8-byte entries: the table of a
// 16384-sample batch stays in the L2 cache), else uint64_t.
template <typename Row>
int64_t dedupe_with(const int64_t* col, int64_t B, int64_t* urows, int32_t* inverse,
                    int32_t* counts) {
  struct Entry {
    Row row;
    int32_t u;
  };
  constexpr Row kEmpty = ~Row{0};
  thread_local std::vector<Entry> table;
  thread_local std::vector<int64_t> pos;
  int64_t cap = 16;
  while (cap < 2 * B) cap <<= 1;
  if (static_cast<int64_t>(table.size()) < cap) table.assign(cap, Entry{kEmpty, 0});
  if (static_cast<int64_t>(pos.size()) < B) pos.resize(B);
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  int shift = 64;
  for (int64_t c = cap; c > 1; c >>= 1) --shift;
  const auto slot_of = [shift](uint64_t row) { return (row * 0x9E3779B97F4A7C15ull) >> shift; };
  constexpr int64_t kProbeAhead = 16;
  Entry* e = table.data();
  int64_t U = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (b + kProbeAhead < B) __builtin_prefetch(e + slot_of(col[b + kProbeAhead]));
    const Row row = static_cast<Row>(col[b]);
    uint64_t h = slot_of(row);
    while (e[h].row != kEmpty && e[h].row != row) h = (h + 1) & mask;
    if (e[h].row == kEmpty) {
      e[h] = Entry{row, static_cast<int32_t>(U)};
      pos[U] = static_cast<int64_t>(h);
      urows[U] = col[b];
      counts[U] = 0;
      ++U;
    }
    const int32_t u = e[h].u;
    ++counts[u];
    inverse[b] = u;
  }
  for (int64_t u = 0; u < U; ++u) e[pos[u]].row = kEmpty;
  return U;
}

// dedupe_with for a table of at most a few times B rows: an index per row of the table
// instead of a hash table (no hashing, no probing; the array is left all -1 for the next call).
int64_t dedupe_direct(const int64_t* col, int64_t B, int64_t rows, int64_t* urows,
                      int32_t* inverse, int32_t* counts) {
  thread_local std::vector<int32_t> index;
  if (static_cast<int64_t>(index.size()) < rows) index.resize(rows, -1);
  int32_t* at = index.data();
  int64_t U = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t row = col[b];
    if (at[row] < 0) {
      at[row] = static_cast<int32_t>(U);
      urows[U] = row;
      counts[U] = 0;
      ++U;
    }
    const int32_t u = at[row];
    ++counts[u];
    inverse[b] = u;
  }
  for (int64_t u = 0; u < U; ++u) at[urows[u]] = -1;
  return U;
}

int64_t dedupe(const TableView& t, const int64_t* col, int64_t B, int64_t* urows,
               int32_t* inverse, int32_t* counts) {
  if (t.rows <= 4 * B) return dedupe_direct(col, B, t.rows, urows, inverse, counts);
  if (t.rows < 0xFFFFFFFFll) return dedupe_with<uint32_t>(col, B, urows, inverse, counts);
  return dedupe_with<uint64_t>(col, B, urows, inverse, counts);
}

void lock_plans(const std::vector<Plan>& locks, int64_t f, uint8_t* lock, bool on) {
  for (const Plan& p : locks) {
    const int64_t n = p.num_unique.data_ptr<int64_t>()[f];
    const int32_t* sl = p.slots.data_ptr<int32_t>() + f * p.slots.size(1);
    for (int64_t u = 0; u < n; ++u)
      if (sl[u] >= 0) lock[sl[u] / kWays] = on ? lock[sl[u] / kWays] | (1 << (sl[u] % kWays)) : 0;
  }
}

struct Admission {
  int64_t hits = 0, misses = 0, evictions = 0, corrupt_slot = -1;
  std::vector<Move> moves;
};

// Hit pass, then miss pass, of one table's unique rows; fills slots and the move lists. The
// rows are first split by one read of their set's tags alone, so that neither list's loop
// branches on whether a row is cached.
void assign_slots(const TableView& table, const int64_t* urows, const int32_t* counts,
                  int64_t U, uint8_t* lock, int32_t* slots, Admission& a) {
  // Local copies: the byte stores below (lock, policy state) may alias any object reached
  // through a pointer, which would make every iteration reload the table's fields.
  const TableView t = table;
  int64_t hit_count = 0, miss_count = 0, evictions = 0;
  thread_local std::vector<int32_t> hit_list, miss_list;
  if (static_cast<int64_t>(hit_list.size()) < U) {
    hit_list.resize(U);
    miss_list.resize(U);
  }
  int32_t* hits = hit_list.data();
  int32_t* misses = miss_list.data();
  // Each row's probe splits it three ways: cached (a hit), or missing with the right to take a
  // way, or missing below the admission count in a set with no empty way. The last stay
  // uncached whatever the rows before them do (an assignment only fills empty ways), so
  // the miss pass never sees them: in steady state, most rows a batch looks up once.
  int64_t nh = 0, nm = 0, refused_samples = 0;
  for (int64_t u = 0; u < U; ++u) {
    if (u + 32 < U) __builtin_prefetch(t.tags + t.set_of(urows[u + 32]) * kWays);
    const int64_t row = urows[u], s = t.set_of(row);
    const uint32_t ways = t.ways_tagged_and_empty(s, static_cast<int16_t>(t.tag_of(row)));
    const uint32_t hit_ways = ways & 0xFF;
    const bool hit = hit_ways != 0;
    const bool refused = !hit && counts[u] < t.admission && (ways >> 8) == 0;
    slots[u] = hit ? static_cast<int32_t>(s * kWays + __builtin_ctz(hit_ways)) : -1;
    hits[nh] = static_cast<int32_t>(u);
    misses[nm] = static_cast<int32_t>(u);
    nh += hit;
    nm += !hit && !refused;
    refused_samples += refused ? counts[u] : 0;
  }
  miss_count += refused_samples;
  for (int64_t i = 0; i < nh; ++i) {
    if (i + 16 < nh) {  // the policy and lock bytes this loop writes: a large cache's miss L2
      const int64_t ahead = slots[hits[i + 16]] / kWays;
      __builtin_prefetch(t.state + (t.policy == 0 ? ahead : ahead * kWays), 1);
      __builtin_prefetch(lock + ahead, 1);
    }
    const int64_t u = hits[i], slot = slots[u];
    hit_count += counts[u];
    touch(t, slot / kWays, static_cast<int>(slot % kWays), false);
    lock[slot / kWays] |= 1 << (slot % kWays);
  }
  a.moves.resize(nm);
  Move* const moves = a.moves.data();
  int64_t nmoves = 0;
  for (int64_t i = 0; i < nm; ++i) {
    const int64_t u = misses[i];
    const int64_t row = urows[u], s = t.set_of(row);
    // a row below the admission count may only take an empty way
    const int way =
        counts[u] >= t.admission ? victim(t, s, lock[s]) : empty_way(t, s, lock[s]);
    if (way < 0) {
      miss_count += counts[u];
      slots[u] = -1;
      continue;
    }
    miss_count += 1;
    hit_count += counts[u] - 1;  // the batch's later samples of the row find it cached
    const int64_t slot = s * kWays + way;
    int64_t old = -1;
    if (t.tags[slot] != -1) {
      old = static_cast<int64_t>(t.tags[slot]) * t.sets + s;
      if (t.tags[slot] < -1 || old >= t.rows) {
        a.corrupt_slot = slot;
        break;
      }
      ++evictions;
    }
    moves[nmoves++] = Move{slot, old, row};
    t.tags[slot] = static_cast<int16_t>(t.tag_of(row));
    touch(t, s, way, true);
    lock[s] |= 1 << way;
    slots[u] = static_cast<int32_t>(slot);
  }
  a.moves.resize(nmoves);
  a.hits = hit_count;
  a.misses = miss_count;
  a.evictions = evictions;
}

void admit_table(const TableView& t, int64_t f, const int64_t* col, int64_t B,
                 uint32_t key, const std::vector<Plan>& locks, const Plan& out) {
  int64_t* urows = out.rows.data_ptr<int64_t>() + f * B;
  int32_t* slots = out.slots.data_ptr<int32_t>() + f * B;
  thread_local std::vector<int32_t> counts;
  if (static_cast<int64_t>(counts.size()) < B) counts.resize(B);
  int64_t U;
  {
    PhaseTimer timer(kDedupe);
    U = dedupe(t, col, B, urows, out.inverse.data_ptr<int32_t>() + f * B, counts.data());
  }
  out.num_unique.data_ptr<int64_t>()[f] = U;
  std::fill(urows + U, urows + B, 0);  // a plan's unused tail is fixed (plans compare equal)
  std::fill(slots, slots + B, -1);
  if (t.sets == 0) return;
  // per set: ways held by locked rows (all zero between calls)
  thread_local std::vector<uint8_t> lock;
  if (static_cast<int64_t>(lock.size()) < t.sets) lock.resize(t.sets, 0);
  thread_local Admission a;
  a.hits = a.misses = a.evictions = 0;
  a.corrupt_slot = -1;
  {
    PhaseTimer timer(kAssign);
    uint8_t* const lk = lock.data();  // (a thread_local's address costs a call per use)
    lock_plans(locks, f, lk, true);
    assign_slots(t, urows, counts.data(), U, lk, slots, a);
    lock_plans(locks, f, lk, false);
    // every lock back to zero: the whole array when it is no longer than the rows' list
    if (t.sets <= U) {
      std::fill(lk, lk + t.sets, uint8_t{0});
    } else {
      for (int64_t u = 0; u < U; ++u) lk[std::max(slots[u], 0) / kWays] = 0;
    }
  }
  TORCH_CHECK_VALUE(a.corrupt_slot < 0, "table ", f, ": cache tag ", t.tags[a.corrupt_slot],
                    " of slot ", a.corrupt_slot, " names no row of the table's ", t.rows,
                    " (corrupt cache state)");
  t.stats[0] += a.hits;
  t.stats[1] += a.misses;
  t.stats[2] += a.evictions;
  PhaseTimer timer(kReplace);
  variant().replace(t, a.moves.data(), static_cast<int64_t>(a.moves.size()), key);
}

}  // namespace

Plan admit(const std::vector<TableView>& ts, const at::Tensor& ids, int64_t seed, int64_t step,
           const std::vector<Plan>& locks, bool parallel) {
  check_ids(ids, ts);
  for (const Plan& p : locks) check_plan(p, ts, "lock plan");
  const int64_t B = ids.size(0), F = ids.size(1);
  Plan out{at::empty({F, B}, at::kLong), at::empty({F}, at::kLong),
           at::empty({F, B}, at::kInt), at::empty({F, B}, at::kInt)};
  std::vector<int64_t> order(F);
  for (int64_t f = 0; f < F; ++f) order[f] = f;
  // Largest tables first: they have the most unique rows, so the dynamic schedule balances.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::min(ts[a].rows, B) > std::min(ts[b].rows, B);
  });
  // The ids table-major: each table's dedupe then reads one contiguous column instead of
  // one id per sample row. Kept between calls: a batch of the last size needs no new pages.
  // (A pointer, not the name, goes into the tasks: on a worker thread the name is that
  // thread's own buffer.)
  thread_local std::vector<int64_t> buffer;
  if (buffer.size() < static_cast<size_t>(B * F)) buffer.resize(static_cast<size_t>(B * F));
  int64_t* const cols = buffer.data();
  {
    PhaseTimer timer(kDedupe);
    const int64_t* idp = ids.data_ptr<int64_t>();
    constexpr int64_t kBlock = 64;
    for (int64_t b0 = 0; b0 < B; b0 += kBlock)
      for (int64_t f = 0; f < F; ++f)
        for (int64_t b = b0; b < std::min(B, b0 + kBlock); ++b) cols[f * B + b] = idp[b * F + f];
  }
  run_tasks(F, order, parallel, [&](int64_t f) {
    const uint32_t key = stream_key(seed, ts[f].stream, kPurposeEvict, step);
    admit_table(ts[f], f, cols + f * B, B, key, locks, out);
  });
  return out;
}

}  // namespace sslrec
