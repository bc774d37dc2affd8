// Kernel execution for the CUDA emulator: each CUDA thread of a block is a fiber on the
// OS thread running the launch (a stream's worker, or the caller for the legacy stream).
// Blocks run one after another in x, y, z order. Within a block, threads start in order
// (reverse order in odd blocks) and run until they return or block at a barrier
// (__syncthreads, __syncwarp, a shuffle); a thread that returns without blocking hands its stack to the next one, so a
// barrier-free kernel uses one stack. When every live thread is blocked, the barriers
// that can complete are released (a warp barrier when every lane of its mask has
// arrived, __syncthreads when every live thread of the block has) and the released
// threads run again in that order. If nothing can be released (a deadlock, divergent warp
// collectives) or a warp collective names a lane that has already returned, the launch
// is abandoned with a message naming the kernel and block.
//
// Context switches: hand-written x86-64 assembly (callee-saved registers, mxcsr and the
// x87 control word: a few ns per switch), ucontext elsewhere. Stacks: 64 KiB, mmap'd
// with a PROT_NONE guard page below, pooled per OS thread. ASan is told about every
// switch; TSan is not (its fiber API crashed under millions of switches): to TSan all
// fibers of a block are its OS thread, which is what they are for race detection.
//
// Ownership: RunGrid owns its BlockRun; stacks belong to the calling OS thread's pool.
// Thread-safety: RunGrid may run on many OS threads at once; everything it touches is
// per call or thread_local.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "l2l_cuda_emu_device.h"

#if defined(__SANITIZE_ADDRESS__)
#define L2L_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(L2L_CUDA_EMU_USE_UCONTEXT)
#define L2L_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

namespace l2l_cuda_emu::detail {

__thread const ThreadContext* t_thread = nullptr;

// Runs a whole grid on the calling OS thread; false with `error` set when the launch
// had to be abandoned. Used by runtime.cc.
bool RunGrid(const GridWork& work, std::string* error);

namespace {

#ifdef L2L_EMU_ASM_SWITCH
// l2l_emu_switch(save_sp, to_sp): pushes the callee-saved state on the current stack,
// stores rsp in *save_sp, loads to_sp and pops the state saved there. A fresh stack is
// prepared so that the pop "returns" into l2l_emu_trampoline, which calls r13.
extern "C" void l2l_emu_switch(void** save_sp, void* to_sp);
extern "C" void l2l_emu_trampoline();
asm(R"(
  .text
  .p2align 4
  .globl l2l_emu_switch
  .hidden l2l_emu_switch
  .type l2l_emu_switch, @function
l2l_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr 8(%rsp)
  fldcw (%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size l2l_emu_switch, .-l2l_emu_switch

  .p2align 4
  .globl l2l_emu_trampoline
  .hidden l2l_emu_trampoline
  .type l2l_emu_trampoline, @function
l2l_emu_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  callq *%r13
  ud2
  .cfi_endproc
  .size l2l_emu_trampoline, .-l2l_emu_trampoline
)");
#endif

constexpr size_t kStackBytes = 64 << 10;

struct Stack {
  char* map = nullptr;  // guard page, then the usable stack
  size_t map_bytes = 0;
  char* bottom = nullptr;  // lowest usable address
};

// The per-OS-thread pool; stacks live until the thread exits.
struct StackPool {
  std::vector<Stack*> free;
  ~StackPool() {
    for (Stack* s : free) {
      munmap(s->map, s->map_bytes);
      delete s;
    }
  }
  Stack* Acquire() {
    if (!free.empty()) {
      Stack* s = free.back();
      free.pop_back();
      return s;
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto* s = new Stack;
    s->map_bytes = kStackBytes + page;
    void* m = mmap(nullptr, s->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "l2l cuda emulator: mmap of a %zu-byte fiber stack failed\n",
                   s->map_bytes);
      std::abort();  // no way to run the kernel; out of address space
    }
    s->map = static_cast<char*>(m);
    mprotect(s->map, page, PROT_NONE);  // overflow faults instead of corrupting
    s->bottom = s->map + page;
    return s;
  }
  void Release(Stack* s) {
#ifdef L2L_EMU_ASAN
    // A fiber that exits by switching away (or is abandoned) leaves its frames' redzones
    // poisoned; the next fiber, or whatever maps this address later, must not see them.
    ASAN_UNPOISON_MEMORY_REGION(s->bottom, kStackBytes);
#endif
    free.push_back(s);
  }
};

thread_local StackPool t_pool;

// A saved execution context (a fiber's or the scheduler's).
struct Context {
#ifdef L2L_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
  const void* stack_bottom = nullptr;  // for ASan
  size_t stack_size = 0;
};

enum class State : uint8_t { kNew, kReady, kWarpWait, kBlockWait, kDone };

struct Fiber {
  ThreadContext ctx;
  Context cx;
  Stack* stack = nullptr;
  State state = State::kNew;
  unsigned wait_mask = 0;      // at a warp barrier: the lanes it waits for
  const char* what = nullptr;  // the collective it waits at, for messages
};

struct BlockRun {
  const GridWork* work = nullptr;
  std::vector<Fiber> fibers;
  unsigned nthreads = 0;
  Context sched;
  Fiber* current = nullptr;
  std::vector<uint64_t> slots;  // one shuffle slot per thread
  std::string failure;          // non-empty: abandon the launch
};

__thread BlockRun* t_run = nullptr;

// Switches from `from` to `to`. `from_exits`: `from` will never be resumed. Not seen by
// TSan: a call that never returns would leave an entry on TSan's shadow stack per fiber.
#ifdef __SANITIZE_THREAD__
__attribute__((no_sanitize("thread"), noinline))
#endif
inline void
SwitchTo(Context* from, Context* to, bool from_exits) {
#ifdef L2L_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(from_exits ? nullptr : &fake_stack, to->stack_bottom,
                                 to->stack_size);
#else
  (void)from_exits;
#endif
#ifdef L2L_EMU_ASM_SWITCH
  l2l_emu_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
#ifdef L2L_EMU_ASAN
  // Back on `from`'s stack. (The out-parameters would describe the stack we came from.)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// First code on a fresh fiber stack. It never returns (it switches away), so TSan must
// not record its entry: every fiber run on a reused stack would grow TSan's shadow stack.
__attribute__((no_sanitize("thread"))) void FiberMain() {
  BlockRun* run = t_run;
  Fiber* f = run->current;
#ifdef L2L_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &run->sched.stack_bottom, &run->sched.stack_size);
#endif
  run->work->run(run->work->closure.get());
  f->state = State::kDone;
  SwitchTo(&f->cx, &run->sched, /*from_exits=*/true);
  __builtin_unreachable();
}

void PrepareFiber(Fiber& f, Stack* s) {
  f.stack = s;
  f.cx.stack_bottom = s->bottom;
  f.cx.stack_size = kStackBytes;
#ifdef L2L_EMU_ASM_SWITCH
  // Frame popped by l2l_emu_switch: [x87 cw][mxcsr][r15][r14][r13][r12][rbx][rbp][ret].
  // After the ret, rsp = top - 16 (16-byte aligned, as the trampoline's call needs).
  char* top = s->bottom + kStackBytes;
  auto* frame = reinterpret_cast<uint64_t*>(top - 16 - 72);
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = fpucw;
  frame[1] = mxcsr;
  frame[2] = 0;                                                // r15
  frame[3] = 0;                                                // r14
  frame[4] = reinterpret_cast<uint64_t>(&FiberMain);           // r13: called
  frame[5] = 0;                                                // r12
  frame[6] = 0;                                                // rbx
  frame[7] = 0;                                                // rbp
  frame[8] = reinterpret_cast<uint64_t>(&l2l_emu_trampoline);  // ret
  f.cx.sp = frame;
#else
  getcontext(&f.cx.uc);
  f.cx.uc.uc_stack.ss_sp = s->bottom;
  f.cx.uc.uc_stack.ss_size = kStackBytes;
  f.cx.uc.uc_link = nullptr;
  makecontext(&f.cx.uc, reinterpret_cast<void (*)()>(&FiberMain), 0);
#endif
}

BlockRun& Run() { return *t_run; }

std::string ThreadName(const Fiber& f) {
  const uint3 t = f.ctx.thread_idx;
  return "thread (" + std::to_string(t.x) + "," + std::to_string(t.y) + "," + std::to_string(t.z) +
         ")";
}

std::string Hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// From a fiber: abandons the launch with `why`. Never returns.
[[noreturn]] void Fault(const std::string& why) {
  BlockRun& run = Run();
  Fiber* f = run.current;
  if (run.failure.empty()) run.failure = ThreadName(*f) + ": " + why;
  f->state = State::kDone;
  SwitchTo(&f->cx, &run.sched, /*from_exits=*/true);
  __builtin_unreachable();
}

// From a fiber: waits until the scheduler releases it.
void Block(State st, unsigned mask, const char* what) {
  BlockRun& run = Run();
  Fiber* f = run.current;
  f->state = st;
  f->wait_mask = mask;
  f->what = what;
  SwitchTo(&f->cx, &run.sched, /*from_exits=*/false);
}

unsigned LinearTid(const BlockRun& run, const Fiber* f) {
  return static_cast<unsigned>(f - run.fibers.data());
}

// When every live thread is blocked: releases the barriers that can complete. Returns
// false (with run.failure set) when none can.
bool Resolve(BlockRun& run, unsigned live) {
  bool released = false;
  const unsigned n = run.nthreads;
  unsigned block_waiting = 0;
  for (unsigned base = 0; base < n; base += 32) {
    const unsigned lanes = n - base < 32 ? n - base : 32;
    const unsigned exist = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
    unsigned waiting = 0, done = 0;
    for (unsigned l = 0; l < lanes; ++l) {
      const State st = run.fibers[base + l].state;
      if (st == State::kWarpWait) waiting |= 1u << l;
      if (st == State::kDone) done |= 1u << l;
      if (st == State::kBlockWait) ++block_waiting;
    }
    unsigned pending = waiting;
    while (pending) {
      const unsigned l = static_cast<unsigned>(__builtin_ctz(pending));
      Fiber& f = run.fibers[base + l];
      const unsigned group = f.wait_mask & exist;
      if (group & done) {
        const unsigned gone = static_cast<unsigned>(__builtin_ctz(group & done));
        run.failure = ThreadName(f) + " (warp " + std::to_string(base / 32) + ", lane " +
                      std::to_string(l) + ") is at " + f.what + " with mask " + Hex(f.wait_mask) +
                      " but lane " + std::to_string(gone) + " (" +
                      ThreadName(run.fibers[base + gone]) +
                      ") has already returned (undefined on a GPU)";
        return false;
      }
      bool complete = (group & ~waiting) == 0;
      for (unsigned g = group; complete && g; g &= g - 1) {
        complete =
            run.fibers[base + static_cast<unsigned>(__builtin_ctz(g))].wait_mask == f.wait_mask;
      }
      if (complete) {
        for (unsigned g = group; g; g &= g - 1) {
          run.fibers[base + static_cast<unsigned>(__builtin_ctz(g))].state = State::kReady;
        }
        waiting &= ~group;
        released = true;
      }
      pending &= ~(group | (1u << l));
    }
  }
  if (!released && block_waiting == live) {
    for (Fiber& f : run.fibers) {
      if (f.state == State::kBlockWait) f.state = State::kReady;
    }
    released = true;
  }
  if (!released) {
    // Describe who waits where: enough to find the divergent branch.
    unsigned at_block = 0, at_warp = 0;
    const Fiber* first_warp = nullptr;
    const Fiber* first_block = nullptr;
    for (const Fiber& f : run.fibers) {
      if (f.state == State::kBlockWait) {
        ++at_block;
        if (!first_block) first_block = &f;
      } else if (f.state == State::kWarpWait) {
        ++at_warp;
        if (!first_warp) first_warp = &f;
      }
    }
    run.failure = "deadlock: " + std::to_string(live) + " live threads, " +
                  std::to_string(at_block) + " waiting at __syncthreads" +
                  (first_block ? " (first: " + ThreadName(*first_block) + ")" : "") + ", " +
                  std::to_string(at_warp) + " at warp collectives" +
                  (first_warp ? " (first: " + ThreadName(*first_warp) + " at " + first_warp->what +
                                    " mask " + Hex(first_warp->wait_mask) + ")"
                              : "") +
                  "; no barrier can complete (divergent __syncthreads or warp collective?)";
  }
  return released;
}

bool RunBlock(BlockRun& run, uint3 block_idx) {
  const GridWork& w = *run.work;
  const unsigned bx = w.block.x, by = w.block.y;
  for (unsigned i = 0; i < run.nthreads; ++i) {
    Fiber& f = run.fibers[i];
    f.ctx.thread_idx = uint3{i % bx, (i / bx) % by, i / (bx * by)};
    f.ctx.block_idx = block_idx;
    f.ctx.block_dim = w.block;
    f.ctx.grid_dim = w.grid;
    f.state = State::kNew;
    f.stack = nullptr;
  }
  unsigned live = run.nthreads;
  bool ok = true;
  // Odd blocks run their threads in reverse order, so a missing barrier between a write
  // and a read of shared memory shows whichever thread index writes.
  const bool reverse = ((block_idx.x + block_idx.y + block_idx.z) & 1u) != 0;
  while (ok) {
    for (unsigned k = 0; k < run.nthreads; ++k) {
      Fiber& f = run.fibers[reverse ? run.nthreads - 1 - k : k];
      if (f.state == State::kNew) {
        PrepareFiber(f, t_pool.Acquire());
        f.state = State::kReady;
      }
      if (f.state != State::kReady) continue;
      run.current = &f;
      t_thread = &f.ctx;
      SwitchTo(&run.sched, &f.cx, /*from_exits=*/false);
      t_thread = nullptr;
      run.current = nullptr;
      if (!run.failure.empty()) {
        ok = false;
        break;
      }
      if (f.state == State::kDone) {
        t_pool.Release(f.stack);
        f.stack = nullptr;
        --live;
      }
    }
    if (!ok || live == 0) break;
    ok = Resolve(run, live);
  }
  // An abandoned block's fibers are never resumed: their frames are dropped (kernel
  // locals are trivially destructible) and their stacks reused.
  for (Fiber& f : run.fibers) {
    if (f.stack) {
      t_pool.Release(f.stack);
      f.stack = nullptr;
    }
  }
  return ok;
}

}  // namespace

bool RunGrid(const GridWork& work, std::string* error) {
  BlockRun run;
  run.work = &work;
  run.nthreads = work.block.x * work.block.y * work.block.z;
  run.fibers.resize(run.nthreads);
  run.slots.assign(run.nthreads, 0);
  BlockRun* outer = t_run;  // a kernel never launches another, but keep it re-entrant
  t_run = &run;
  bool ok = true;
  for (unsigned z = 0; ok && z < work.grid.z; ++z) {
    for (unsigned y = 0; ok && y < work.grid.y; ++y) {
      for (unsigned x = 0; ok && x < work.grid.x; ++x) {
        if (!RunBlock(run, uint3{x, y, z})) {
          ok = false;
          *error = std::string("kernel ") + work.name + " block (" + std::to_string(x) + "," +
                   std::to_string(y) + "," + std::to_string(z) + ") of grid (" +
                   std::to_string(work.grid.x) + "," + std::to_string(work.grid.y) + "," +
                   std::to_string(work.grid.z) + ") x block (" + std::to_string(work.block.x) +
                   "," + std::to_string(work.block.y) + "," + std::to_string(work.block.z) +
                   "): " + run.failure;
        }
      }
    }
  }
  t_run = outer;
  return ok;
}

void BlockBarrier() { Block(State::kBlockWait, 0, "__syncthreads"); }

void WarpBarrier(unsigned mask, const char* what) {
  BlockRun& run = Run();
  const unsigned lane = LinearTid(run, run.current) & 31;
  if (!(mask & (1u << lane))) {
    Fault(std::string(what) + " with mask " + Hex(mask) + " that does not name the calling lane " +
          std::to_string(lane));
  }
  Block(State::kWarpWait, mask, what);
}

uint64_t ShuffleBits(unsigned mask, uint64_t bits, ShflMode mode, int arg, int width,
                     const char* what) {
  BlockRun& run = Run();
  const unsigned tid = LinearTid(run, run.current);
  const int lane = static_cast<int>(tid & 31);
  const unsigned base = tid & ~31u;
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    Fault(std::string(what) + " with width " + std::to_string(width) +
          " (must be a power of two <= 32)");
  }
  const int seg = lane & ~(width - 1);
  int src = lane;  // lane whose value we read; own value when out of the segment
  switch (mode) {
    case ShflMode::kIdx:
      src = seg + (arg & (width - 1));
      break;
    case ShflMode::kXor:
      src = lane ^ arg;
      if (src < 0 || src >= seg + width) src = lane;
      break;
    case ShflMode::kUp:
      src = lane - arg;
      if (src < seg) src = lane;
      break;
    case ShflMode::kDown:
      src = lane + arg;
      if (src >= seg + width) src = lane;
      break;
  }
  run.slots[tid] = bits;
  WarpBarrier(mask, what);
  uint64_t out = bits;
  if (src != lane) {
    const unsigned src_tid = base + static_cast<unsigned>(src);
    const bool valid = src_tid < run.nthreads && (mask & (1u << src)) != 0;
    out = valid ? run.slots[src_tid] : ~uint64_t{0};  // undefined on a GPU: poison
  }
  WarpBarrier(mask, what);
  return out;
}

}  // namespace l2l_cuda_emu::detail
