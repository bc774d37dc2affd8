// Tests of eps_server/page_allocator.h: alignment, zero fill, reuse, budget.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <set>

#include "eps_server/page_allocator.h"

namespace l2l::eps {

TEST_CASE("PageAllocator hands out aligned zeroed distinct pages", "[eps][page_allocator]") {
  PageAllocator alloc(8192, 0);
  std::set<void*> seen;
  for (int i = 0; i < 10; ++i) {
    auto p = alloc.Allocate();
    REQUIRE(p.ok());
    CHECK(reinterpret_cast<uintptr_t>(*p) % 4096 == 0);
    const char* c = static_cast<const char*>(*p);
    for (size_t k = 0; k < 8192; k += 509) CHECK(c[k] == 0);
    std::memset(*p, 0xab, 8192);
    seen.insert(*p);
  }
  CHECK(seen.size() == 10);
  CHECK(alloc.pages_in_use() == 10);
}

TEST_CASE("PageAllocator reuses freed pages and zeroes them again", "[eps][page_allocator]") {
  PageAllocator alloc(4096, 0);
  auto a = alloc.Allocate();
  REQUIRE(a.ok());
  std::memset(*a, 0x5a, 4096);
  alloc.Free(*a);
  CHECK(alloc.pages_in_use() == 0);
  auto b = alloc.Allocate();
  REQUIRE(b.ok());
  CHECK(*b == *a);
  CHECK(static_cast<const char*>(*b)[100] == 0);
  CHECK(alloc.bytes_mapped() == 4096);
}

TEST_CASE("PageAllocator refuses to exceed its budget with the numbers", "[eps][page_allocator]") {
  PageAllocator alloc(4096, 3 * 4096);
  for (int i = 0; i < 3; ++i) REQUIRE(alloc.Allocate().ok());
  auto over = alloc.Allocate();
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == StatusCode::kResourceExhausted);
  CHECK(over.status().message().find("12288") != std::string::npos);
}

}  // namespace l2l::eps
