#include "runtime/host_sync.h"

#include <execinfo.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/debugging/symbolize.h"

namespace tandem {
namespace {

std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_unexpected{0};
std::atomic<bool> g_debug{false};
thread_local int t_expected = 0;
thread_local int t_device_thread = 0;

// The stack of an unexpected synchronization, innermost frame first, without the frames of
// this file.
void PrintStack(int64_t n, const char* what) {
  // glibc's unwinder reads the unwind tables, so it needs no frame pointers (the optimized
  // build has none); absl::Symbolize names the frames from the binary's symbol table.
  void* frames[32];
  const int depth = backtrace(frames, 32);
  std::string text;
  for (int i = 2; i < depth; ++i) {  // below Record and this function
    char name[512];
    const char* symbol = absl::Symbolize(frames[i], name, sizeof(name)) ? name : "?";
    text += "    ";
    text += symbol;
    text += "\n";
  }
  std::fprintf(stderr, "tandem: host sync #%lld (%s) outside an expected read, from:\n%s",
               static_cast<long long>(n), what, text.c_str());
  std::fflush(stderr);
}

}  // namespace

void HostSync::Record(const char* what) {
  if (t_device_thread > 0) return;
  const int64_t n = g_count.fetch_add(1, std::memory_order_relaxed) + 1;
  if (t_expected > 0) return;
  g_unexpected.fetch_add(1, std::memory_order_relaxed);
  if (g_debug.load(std::memory_order_relaxed)) PrintStack(n, what);
}

int64_t HostSync::Count() { return g_count.load(std::memory_order_relaxed); }

int64_t HostSync::UnexpectedCount() { return g_unexpected.load(std::memory_order_relaxed); }

void HostSync::SetDebug(bool on) { g_debug.store(on); }

bool HostSync::debug() { return g_debug.load(std::memory_order_relaxed); }

ExpectedHostSync::ExpectedHostSync() { ++t_expected; }
ExpectedHostSync::~ExpectedHostSync() { --t_expected; }

DeviceThreadScope::DeviceThreadScope() { ++t_device_thread; }
DeviceThreadScope::~DeviceThreadScope() { --t_device_thread; }

bool OnDeviceThread() { return t_device_thread > 0; }

}  // namespace tandem
