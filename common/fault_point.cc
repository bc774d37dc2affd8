// L2L_FAULT_AT / L2L_DELAY_AT / L2L_STOP_AT parsing (read through common/env.h) and the
// per-site hit counters (see fault_point.h).
#include "common/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/env.h"

namespace l2l {
namespace {

struct Site {
  std::string name;
  long long at = 0;  // L2L_FAULT_AT: the hit that kills; L2L_DELAY_AT: milliseconds per hit
  std::atomic<long long> hits{0};
};

// Parsed once, on the first FaultPoint call; never freed (sites may be hit at exit).
std::vector<Site*>* ParseSites(EnvVar var_id) {
  auto* sites = new std::vector<Site*>();
  const std::optional<std::string> env = EnvText(var_id);
  if (!env) return sites;
  const char* var = EnvInfo(var_id).name;
  const std::string& s = *env;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, end - pos);
    const size_t colon = item.rfind(':');
    char* rest = nullptr;
    const long long n = colon == std::string::npos ? 0 : std::strtoll(item.c_str() + colon + 1, &rest, 10);
    if (colon == std::string::npos || colon == 0 || n <= 0 || rest == nullptr || *rest != '\0') {
      std::fprintf(stderr, "%s: ignoring '%s' (expected <site>:<n>, n >= 1)\n", var, item.c_str());
    } else {
      auto* site = new Site();
      site->name = item.substr(0, colon);
      site->at = n;
      sites->push_back(site);
    }
    pos = end + 1;
  }
  return sites;
}

}  // namespace

namespace {

// write(2) only: the process may be in any state.
void Say(const char* what, const char* site) {
  (void)!::write(2, what, std::strlen(what));
  (void)!::write(2, site, std::strlen(site));
  (void)!::write(2, "\n", 1);
}

}  // namespace

void FaultPoint(const char* site) {
  static const std::vector<Site*>* sites = ParseSites(EnvVar::kFaultAt);
  static const std::vector<Site*>* delays = ParseSites(EnvVar::kDelayAt);
  static const std::vector<Site*>* stops = ParseSites(EnvVar::kStopAt);
  for (const Site* d : *delays) {
    if (d->name == site) std::this_thread::sleep_for(std::chrono::milliseconds(d->at));
  }
  for (Site* s : *stops) {
    if (s->name != site) continue;
    if (s->hits.fetch_add(1, std::memory_order_relaxed) + 1 == s->at) {
      Say("L2L_STOP_AT: SIGSTOP at ", site);
      ::kill(::getpid(), SIGSTOP);  // every thread stalls until someone sends SIGCONT
    }
  }
  for (Site* s : *sites) {
    if (s->name != site) continue;
    if (s->hits.fetch_add(1, std::memory_order_relaxed) + 1 == s->at) {
      Say("L2L_FAULT_AT: injected SIGKILL at ", site);
      ::kill(::getpid(), SIGKILL);
      ::_exit(137);  // not reached
    }
  }
}

}  // namespace l2l
