// Network utilities: addresses, supervised loops, line framing.

#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

// ---- redirects ------------------------------------------------------------------------------

TEST_CASE("addresses with stray brackets are refused", "[net][address]") {
  using doorman::net::parse_address;
  CHECK_FALSE(parse_address("[[x]:11"));
  CHECK_FALSE(parse_address("[x]]:11"));
  CHECK_FALSE(parse_address("a]:11"));
  CHECK_FALSE(parse_address("[::1]]:11"));
  CHECK(parse_address("[::1]:11") == doorman::net::address{"::1", "11"});
  CHECK(parse_address("host:0") == doorman::net::address{"host", "0"});
}

TEST_CASE("a coroutine that throws is reported and started again", "[net][supervise]") {
  asio::io_context io;
  std::vector<std::string> logged;
  int runs = 0;
  bool stopping = false;
  asio::co_spawn(io,
                 doorman::net::supervised(
                     "test loop",
                     [&]() -> asio::awaitable<void> {
                       if (++runs < 3) throw std::runtime_error("boom");
                       co_return;
                     },
                     [&] { return stopping; }, [&](std::string_view s) { logged.emplace_back(s); }),
                 asio::detached);
  io.run_for(10s);  // returns as soon as the loop ends
  CHECK(runs == 3);
  REQUIRE(logged.size() == 2);
  CHECK(logged[0] == "error: test loop failed (boom); restarting");
}

TEST_CASE("line framing: lines across reads, one limit, each byte scanned once", "[net][framing]") {
  doorman::net::line_buffer in(8);
  in.append("ab");
  CHECK_FALSE(in.next_line());
  in.append("c\nde\n\nfg");
  CHECK(in.next_line() == std::optional<std::string_view>("abc"));
  CHECK(in.next_line() == std::optional<std::string_view>("de"));
  CHECK(in.next_line() == std::optional<std::string_view>(""));
  CHECK_FALSE(in.next_line());
  CHECK(in.lines() == 3);
  in.compact();
  in.append("h\n");
  CHECK(in.next_line() == std::optional<std::string_view>("fgh"));
  CHECK_FALSE(in.too_long());

  SECTION("a complete line beyond the limit") {
    in.append("123456789\nok\n");
    CHECK_FALSE(in.next_line());
    CHECK(in.too_long());
    CHECK_FALSE(in.next_line());  // for good
  }
  SECTION("an unfinished rest beyond the limit") {
    in.append("123456789");
    CHECK_FALSE(in.next_line());
    CHECK(in.too_long());
  }
  SECTION("exactly the limit is accepted") {
    in.append("12345678\n");
    CHECK(in.next_line() == std::optional<std::string_view>("12345678"));
  }
}

TEST_CASE("line framing: reads fill a buffer sized to what the peer sends", "[net][framing]") {
  using doorman::net::line_buffer;
  line_buffer in(1 << 20);
  // As a read would: copy into the room offered, then commit.
  auto read = [&](std::string_view bytes) {
    const auto room = in.prepare();
    REQUIRE(room.size() >= line_buffer::first_read);
    REQUIRE(room.size() <= line_buffer::largest_read);
    const std::size_t n = std::min(bytes.size(), room.size());
    std::memcpy(room.data(), bytes.data(), n);
    in.commit(n);
    return n;
  };
  // Short requests, one at a time: the first offer is never outgrown.
  for (int i = 0; i < 100; ++i) {
    read("{\"id\":1}\n");
    CHECK(in.next_line() == std::optional<std::string_view>("{\"id\":1}"));
    in.compact();
  }
  CHECK(in.capacity() == line_buffer::first_read);
  CHECK(in.lines() == 100);

  // A pipelining peer fills every offer: the offers double, up to 16 KiB.
  const std::string line(99, 'x');
  std::string stream;
  while (stream.size() < 200000)
    stream += line + "\n";
  std::size_t taken = 0;
  std::size_t largest = 0;
  std::size_t lines = 0;
  while (taken < stream.size()) {
    const std::size_t n = read(std::string_view(stream).substr(taken));
    largest = std::max(largest, n);
    taken += n;
    while (const auto got = in.next_line()) {
      REQUIRE(*got == line);  // whole lines, in order, across reads
      ++lines;
    }
    in.compact();
  }
  CHECK(lines == stream.size() / 100);
  CHECK(largest == line_buffer::largest_read);
  CHECK(in.capacity() <= 4 * line_buffer::largest_read);

  // One long message grows the buffer past 64 KiB; once handled, the memory goes back.
  const std::string long_line(300000, 'y');
  in.append(long_line + "\n");
  CHECK(in.capacity() > 4 * line_buffer::largest_read);
  CHECK(in.next_line()->size() == long_line.size());
  in.compact();
  CHECK(in.capacity() == 0);
  read("after\n");
  CHECK(in.next_line() == std::optional<std::string_view>("after"));
}

TEST_CASE("errors are error_codes of one category, with messages", "[net][errors]") {
  const std::error_code e = doorman::errc::too_many_redirects;
  CHECK(e.category().name() == std::string("doorman"));
  CHECK(e.message() == "too many mastership redirects");
  CHECK(std::error_code(doorman::errc::timed_out) != std::error_code(doorman::errc::unreachable));
  CHECK(std::error_code(doorman::errc::shut_down).message() == "shut down");
}
