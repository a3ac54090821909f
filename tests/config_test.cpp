// The time helpers, globs and the resource configuration.

#include "core_support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (core_support.hpp)

// ---- time -------------------------------------------------------------------------------

TEST_CASE("manual clock moves only when told", "[core][time]") {
  manual_clock clock;
  const auto t0 = clock.now();
  clock.advance(1500ms);
  CHECK(clock.now() - t0 == 1500ms);
  clock.advance(doorman::seconds{0.25});
  CHECK(doorman::to_seconds(clock.now() - t0) == Approx(1.75));
}

TEST_CASE("relative seconds convert to durations without overflow", "[core][time]") {
  using ns = std::chrono::nanoseconds;
  CHECK(doorman::to_duration<ns>(1.5) == 1500ms);
  CHECK(doorman::to_duration<ns>(1e300) > 100'000h);
  CHECK(doorman::to_duration<ns>(-1e300) < -100'000h);
  CHECK(doorman::to_duration<ns>(std::nan("")) == ns::zero());
}

// ---- glob -------------------------------------------------------------------------------

TEST_CASE("globs match as Go's filepath.Match (Doorman's): * and ? stop at /", "[core][glob]") {
  using doorman::glob_match;
  CHECK(glob_match("*", ""));
  CHECK(glob_match("*", "anything at all"));
  CHECK_FALSE(glob_match("*", "anything/at all"));
  CHECK_FALSE(glob_match("fair*", "fair/shard-1"));
  CHECK(glob_match("fair*", "fair-shard-1"));
  CHECK(glob_match("fair/*", "fair/shard-1"));
  CHECK_FALSE(glob_match("fair/?", "fair//"));
  CHECK(glob_match("*/*", "a/b"));
  CHECK_FALSE(glob_match("*/*", "a/b/c"));
  // A class may match '/', and a later star then starts after it.
  CHECK(glob_match("*[a/]*b", "a/b"));
  CHECK(glob_match("a**b", "axxb"));
  CHECK(glob_match("\\/x", "/x"));
  CHECK(glob_match("mysql-*", "mysql-shard-17"));
  CHECK_FALSE(glob_match("mysql-*", "pg-shard-1"));
  CHECK(glob_match("shard-?", "shard-7"));
  CHECK_FALSE(glob_match("shard-?", "shard-17"));
  CHECK(glob_match("shard-[0-9][0-9]", "shard-17"));
  CHECK_FALSE(glob_match("shard-[!0-9]", "shard-1"));
  CHECK(glob_match("a*b*c", "aXXbYYbZc"));
  CHECK(glob_match("lit\\*", "lit*"));
  CHECK_FALSE(glob_match("lit\\*", "litX"));
  // A pathological pattern stays linear-ish rather than exponential.
  CHECK_FALSE(glob_match("*a*a*a*a*a*a*a*b", std::string(5000, 'a')));
  CHECK(glob_match(std::string(600, '*') + "b", std::string(600, 'a') + "b"));  // a long pattern
  // A literal head (an access rule's escaped identity) is compared as it is.
  const std::string identity = "\\s\\p\\i\\f\\f\\e\\:\\/\\/\\d\\/\\a";  // spiffe://d/a
  CHECK(glob_match(identity, "spiffe://d/a"));
  CHECK_FALSE(glob_match(identity, "spiffe://d/ab"));
  CHECK_FALSE(glob_match(identity, "spiffe://d/"));
  CHECK(glob_match(identity + "#*", "spiffe://d/a#worker-7"));
  CHECK_FALSE(glob_match(identity + "#*", "spiffe://d/b#worker-7"));
  CHECK_FALSE(glob_match(identity + "#*", "spiffe://d/a#worker/7"));
  CHECK(glob_match("exact", "exact"));
  CHECK_FALSE(glob_match("exact", "exactly"));
  CHECK_FALSE(glob_match("", "x"));
  CHECK(glob_match("", ""));
}

namespace {

// Go's filepath.Match written the slow way, by trying every split (small inputs only).
bool reference_match(std::string_view p, std::string_view t) {
  if (p.empty()) return t.empty();
  if (p[0] == '*') {
    for (std::size_t n = 0; n <= t.size(); ++n) {
      if (reference_match(p.substr(1), t.substr(n))) return true;
      if (n < t.size() && t[n] == '/') return false;
    }
    return false;
  }
  if (t.empty()) return false;
  if (p[0] == '?') return t[0] != '/' && reference_match(p.substr(1), t.substr(1));
  if (p[0] == '[') {
    std::size_t i = 1;
    const bool negate = i < p.size() && (p[i] == '!' || p[i] == '^');
    if (negate) ++i;
    bool found = false;
    for (bool first = true; i < p.size() && (first || p[i] != ']'); first = false) {
      unsigned char lo = static_cast<unsigned char>(p[i] == '\\' ? p[++i] : p[i]);
      unsigned char hi = lo;
      if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
        i += 2;
        hi = static_cast<unsigned char>(p[i] == '\\' ? p[++i] : p[i]);
      }
      const auto c = static_cast<unsigned char>(t[0]);
      found |= lo <= c && c <= hi;
      ++i;
    }
    return found != negate && reference_match(p.substr(i + 1), t.substr(1));
  }
  const bool escaped = p[0] == '\\' && p.size() > 1;
  return t[0] == p[escaped ? 1 : 0] && reference_match(p.substr(escaped ? 2 : 1), t.substr(1));
}

}  // namespace

TEST_CASE("globs match as the slow reference does, on random patterns", "[core][glob]") {
  doorman::detail::splitmix64 draw(7);
  const std::string_view pattern_bytes = "ab/*?[]!-\\#";
  const std::string_view text_bytes = "ab/#-]";
  int checked = 0;
  for (int n = 0; n < 200000; ++n) {
    std::string p;
    std::string t;
    for (auto k = draw.next() % 9; k > 0; --k)
      p += pattern_bytes[draw.next() % pattern_bytes.size()];
    for (auto k = draw.next() % 9; k > 0; --k)
      t += text_bytes[draw.next() % text_bytes.size()];
    if (doorman::glob_error(p)) continue;
    ++checked;
    INFO("pattern " << p << ", text " << t);
    REQUIRE(doorman::glob_match(p, t) == reference_match(p, t));
  }
  CHECK(checked > 50000);
}

TEST_CASE("an id that no glob matches for its '/' gets the last template", "[core][glob]") {
  const auto repo = doorman::resource_repository::parse(R"({"resources": [
    {"identifier_glob": "fair*", "capacity": 5,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16}},
    {"identifier_glob": "*", "capacity": 9,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16}}]})");
  CHECK(repo.find("fair-1").capacity == 5);
  CHECK(repo.find("fair/shard-1").capacity == 9);
  CHECK(repo.find("a/b/c").capacity == 9);
}

TEST_CASE("invalid globs are explained", "[core][glob]") {
  CHECK(doorman::glob_error("ok-*") == std::nullopt);
  CHECK_THAT(*doorman::glob_error("x[ab"), Contains("never closed"));
  CHECK_THAT(*doorman::glob_error("x\\"), Contains("unescaped"));
  CHECK_THAT(*doorman::glob_error("x[z-a]"), Contains("reversed range"));
  CHECK_THAT(*doorman::glob_error("x[!]"), Contains("never closed"));
  // Validation reads ranges exactly as the matcher does: escaped ends count as what they escape.
  CHECK_THAT(*doorman::glob_error("[\\z-a]"), Contains("reversed range"));
  CHECK_THAT(*doorman::glob_error("[\\a-\\Z]"), Contains("reversed range"));
  CHECK(doorman::glob_error("[a-c-b]") == std::nullopt);  // a-c, '-', b: nothing reversed
  CHECK(doorman::glob_match("[a-c-b]", "-"));
  CHECK(doorman::glob_match("[a-c-b]", "b"));
  CHECK_FALSE(doorman::glob_match("[a-c-b]", "d"));
  CHECK(doorman::glob_error("[\\a-\\z]") == std::nullopt);
  CHECK(doorman::glob_match("[\\a-\\z]", "q"));
}

// ---- config -----------------------------------------------------------------------------

TEST_CASE("a Doorman-style configuration parses, with comments and defaults", "[core][config]") {
  const auto repo = doorman::resource_repository::parse(R"({
    // MySQL replicas
    "resources": [
      { "identifier_glob": "mysql-*", "capacity": 500, "safe_capacity": 10,
        "description": "MySQL replica shards, queries per second",
        "algorithm": { "kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16,
                       "learning_mode_duration": 30, "parameters": {"x": 1} } },
      { "identifier_glob": "mysql-shard-17", "capacity": 5,
        "algorithm": { "kind": "static", "lease_length": 20, "refresh_interval": 5 } },
      /* everything else */
      { "identifier_glob": "*", "capacity": 0,
        "algorithm": { "kind": "no_algorithm", "lease_length": 60, "refresh_interval": 16 } }
    ]})");
  REQUIRE(repo.templates().size() == 3);
  const auto& mysql = repo.templates()[0];
  CHECK(mysql.safe_capacity == 10);
  CHECK(mysql.algorithm.kind == "FAIR_SHARE");
  CHECK(mysql.algorithm.learning_mode_duration.count() == 30);
  CHECK(mysql.algorithm.parameters["x"] == 1);
  CHECK(repo.templates()[1].algorithm.kind == "STATIC");
  CHECK(repo.templates()[1].algorithm.learning_mode_duration.count() == 20);  // = lease_length
  CHECK(repo.templates()[2].algorithm.kind == "NO_ALGORITHM");

  SECTION("lookup: exact match first, then the first matching glob") {
    CHECK(repo.find("mysql-shard-17").capacity == 5);
    CHECK(repo.find("mysql-shard-18").capacity == 500);
    CHECK(repo.find("redis").capacity == 0);
  }
  SECTION("round trip through JSON") {
    CHECK(doorman::resource_repository::from_json(repo.to_json()) == repo);
  }
}

TEST_CASE("each invalid configuration gives an error naming the field", "[core][config]") {
  const std::string good_alg =
      R"("algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16})";
  const std::string tail = R"({"identifier_glob": "*", "capacity": 0, )" + good_alg + "}";
  auto error_of = [](const std::string& text) -> std::string {
    try {
      (void)doorman::resource_repository::parse(text);
    } catch (const doorman::config_error& e) {
      return e.what();
    }
    return "no error";
  };
  auto with_first = [&](const std::string& first) {
    return error_of(R"({"resources": [)" + first + "," + tail + "]}");
  };
  auto with_alg = [&](const std::string& alg) {
    return with_first(R"({"identifier_glob": "a*", "capacity": 1, "algorithm": )" + alg + "}");
  };

  try {
    (void)doorman::resource_repository::parse("{}");
    FAIL("no error");
  } catch (const doorman::config_error& e) {
    CHECK(e.path() == "resources");
    CHECK(e.code() == doorman::errc::invalid_config);
    CHECK(e.code().message() == "invalid configuration");
    CHECK(std::string(e.code().category().name()) == "doorman");
  }
  CHECK_THAT(error_of("{"), Contains("not valid JSON"));
  CHECK(error_of("[]") == "must be an object");
  CHECK(error_of("{}") == "resources: is required");
  CHECK(error_of(R"({"resources": {}})") == "resources: must be an array");
  CHECK(error_of(R"({"resources": []})") == "resources: must hold at least one template");
  CHECK(error_of(R"({"resources": [], "extra": 1})") == "extra: unknown field");
  CHECK(with_first(R"({"capacity": 1, )" + good_alg + "}") ==
        "resources[0].identifier_glob: is required");
  CHECK(with_first(R"({"identifier_glob": 3, "capacity": 1, )" + good_alg + "}") ==
        "resources[0].identifier_glob: must be a string");
  CHECK(with_first(R"({"identifier_glob": "", "capacity": 1, )" + good_alg + "}") ==
        "resources[0].identifier_glob: must not be empty");
  CHECK_THAT(with_first(R"({"identifier_glob": "a[", "capacity": 1, )" + good_alg + "}"),
             Contains("resources[0].identifier_glob: invalid glob"));
  CHECK(with_first(R"({"identifier_glob": "a*", )" + good_alg + "}") ==
        "resources[0].capacity: is required");
  CHECK(with_first(R"({"identifier_glob": "a*", "capacity": "5", )" + good_alg + "}") ==
        "resources[0].capacity: must be a number");
  CHECK(with_first(R"({"identifier_glob": "a*", "capacity": -1, )" + good_alg + "}") ==
        "resources[0].capacity: must be between 0 and 1e15");
  CHECK_THAT(with_first(R"({"identifier_glob": "a*", "capacity": 1e999, )" + good_alg + "}"),
             Contains("not valid JSON") && Contains("number overflow"));
  CHECK(with_first(R"({"identifier_glob": "a*", "capacity": 1, "safe_capacity": -2, )" + good_alg +
                   "}") ==
        "resources[0].safe_capacity: must be between 0 and 1e15, or -1 for unlimited");
  CHECK(with_first(R"({"identifier_glob": "a*", "capacity": 2e15, )" + good_alg + "}") ==
        "resources[0].capacity: must be between 0 and 1e15");
  CHECK(with_first(R"({"identifier_glob": "a*", "capacity": 1, "colour": 1, )" + good_alg + "}") ==
        "resources[0].colour: unknown field");
  CHECK(with_first(R"({"identifier_glob": "a*", "capacity": 1})") ==
        "resources[0].algorithm: is required");
  CHECK(with_alg(R"({"lease_length": 60, "refresh_interval": 16})") ==
        "resources[0].algorithm.kind: is required");
  CHECK(with_alg(R"({"kind": "BEST", "lease_length": 60, "refresh_interval": 16})") ==
        "resources[0].algorithm.kind: unknown algorithm kind \"BEST\" (known: NO_ALGORITHM, "
        "STATIC, PROPORTIONAL_SHARE, FAIR_SHARE)");
  CHECK_THAT(with_alg(R"({"kind": "Fair_Share", "lease_length": 60, "refresh_interval": 16})"),
             Contains("unknown algorithm kind"));
  CHECK(with_alg(R"({"kind": "STATIC", "refresh_interval": 16})") ==
        "resources[0].algorithm.lease_length: is required");
  CHECK(with_alg(R"({"kind": "STATIC", "lease_length": 10, "refresh_interval": 16})") ==
        "resources[0].algorithm.lease_length: must be >= refresh_interval");
  // Above a day (as Doorman's configurations may say), up to what the wire carries.
  CHECK(with_alg(R"({"kind": "STATIC", "lease_length": 604800, "refresh_interval": 16})") ==
        "no error");
  CHECK(with_alg(R"({"kind": "STATIC", "lease_length": 1000001, "refresh_interval": 16})") ==
        "resources[0].algorithm.lease_length: must be between 0.1 and 1e6 seconds");
  CHECK(with_alg(R"({"kind": "STATIC", "lease_length": 60, "refresh_interval": 0})") ==
        "resources[0].algorithm.refresh_interval: must be between 0.1 and 1e6 seconds");
  CHECK(with_alg(R"({"kind": "STATIC", "lease_length": 60, "refresh_interval": 16,
                     "learning_mode_duration": -1})") ==
        "resources[0].algorithm.learning_mode_duration: must be between 0 and 1e6 seconds");
  CHECK(with_alg(R"({"kind": "STATIC", "lease_length": 60, "refresh_interval": 16,
                     "parameters": {"p": [1]}})") ==
        "resources[0].algorithm.parameters.p: must be a string, number or boolean");
  CHECK(with_first(tail) ==
        "resources[1].identifier_glob: duplicates "
        "resources[0].identifier_glob \"*\"");
  CHECK(
      error_of(R"({"resources": [{"identifier_glob": "a*", "capacity": 1, )" + good_alg + "}]}") ==
      "resources[0].identifier_glob: the last template must have identifier_glob \"*\" so "
      "that every resource id resolves");
}

TEST_CASE(
    "config follower: reads on time, applies each new version once, keeps the old on "
    "failure, rejection or deletion",
    "[config][follower]") {
  using namespace std::chrono_literals;
  manual_clock clock;
  doorman::config_follower<manual_clock::time_point> f("etcd:/c", doorman::seconds(1), 7,
                                                       clock.now());
  CHECK(f.next_read() == clock.now() + 1s);

  // The version in use: nothing to do, nothing said.
  clock.advance(1s);
  CHECK_FALSE(f.read(clock.now(), 7).apply);
  CHECK(f.take_log().empty());
  CHECK(f.next_read() == clock.now() + 1s);

  // A new version: applied once, accepted.
  clock.advance(1s);
  REQUIRE(f.read(clock.now(), 9).apply);
  CHECK(f.applied(std::nullopt));
  CHECK(f.take_log() == std::vector<std::string>{"configuration etcd:/c revision 9 accepted"});
  CHECK_FALSE(f.read(clock.now(), 9).apply);

  // A bad version: rejected once, never retried, the old one kept.
  REQUIRE(f.read(clock.now(), 10).apply);
  CHECK_FALSE(f.applied("resources[0].capacity: must be a number"));
  CHECK(f.take_log() == std::vector<std::string>{
                            "warning: configuration etcd:/c revision 10 rejected, keeping the old "
                            "one: resources[0].capacity: must be a number"});
  CHECK_FALSE(f.read(clock.now(), 10).apply);
  CHECK(f.take_log().empty());

  // Failures: the first is said, the next are not; the recovery is said.
  f.failed(clock.now(), "no etcd member answered");
  f.failed(clock.now(), "no etcd member answered");
  CHECK(f.failing());
  CHECK(f.next_read() == clock.now() + 1s);
  CHECK(f.take_log() == std::vector<std::string>{"warning: configuration etcd:/c: cannot read "
                                                 "(no etcd member answered); keeping the "
                                                 "current one"});
  CHECK_FALSE(f.read(clock.now(), 10).apply);
  CHECK(f.take_log() == std::vector<std::string>{"configuration etcd:/c: readable again"});

  // Deleted: said once, the configuration kept; the key back, even at a version seen, applies.
  CHECK_FALSE(f.read(clock.now(), std::nullopt).apply);
  CHECK_FALSE(f.read(clock.now(), std::nullopt).apply);
  CHECK(f.take_log() == std::vector<std::string>{
                            "warning: configuration etcd:/c deleted; keeping the current one"});
  CHECK(f.read(clock.now(), 10).apply);

  // A reload wakes it at once.
  clock.advance(300ms);
  f.wake(clock.now());
  CHECK(f.next_read() == clock.now());
}

TEST_CASE(
    "config follower: a reread applies even a version seen and says each failure asked, "
    "interval 0 reads only when asked, a file source says nothing of versions",
    "[config][follower]") {
  using namespace std::chrono_literals;
  manual_clock clock;
  doorman::config_follower<manual_clock::time_point> f("files", doorman::seconds(0), 7, clock.now(),
                                                       false);
  CHECK(f.next_read() == manual_clock::time_point::max());  // no polling

  // SIGHUP: read now; the same version is applied again.
  f.reread(clock.now());
  CHECK(f.next_read() == clock.now());
  REQUIRE(f.read(clock.now(), 7).apply);
  CHECK(f.next_read() == manual_clock::time_point::max());
  CHECK(f.applied(std::nullopt));
  CHECK_FALSE(f.applied("bad"));
  CHECK(f.take_log().empty());                // the applier says what it applied
  CHECK_FALSE(f.read(clock.now(), 7).apply);  // once only

  // A failure in a row is said once, but again when a reread asks; the reread still applies
  // once the source is readable.
  const std::string said =
      "warning: configuration files: cannot read (x: cannot be reached); keeping the current one";
  f.failed(clock.now(), "x: cannot be reached");
  f.failed(clock.now(), "x: cannot be reached");
  CHECK(f.take_log() == std::vector<std::string>{said});
  f.reread(clock.now());
  f.failed(clock.now(), "x: cannot be reached");
  f.failed(clock.now(), "x: cannot be reached");
  CHECK(f.take_log() == std::vector<std::string>{said});
  CHECK(f.read(clock.now(), 7).apply);
  CHECK(f.take_log() == std::vector<std::string>{"configuration files: readable again"});
}
