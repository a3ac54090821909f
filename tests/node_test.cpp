// Nodes: in-process trees, and the doorman-node binary (flags, reload, signals).

#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

// ---- a tree ------------------------------------------------------------------------------

TEST_CASE("root and two intermediates converge to the FAIR_SHARE result", "[net][tree]") {
  running_node root(fast_config(100));
  doorman::node_options mid;
  mid.parents = {root.address()};
  running_node left("", mid);
  running_node right("", mid);

  // Left: 3 clients wanting 30 each; right: one wanting 60. 4 end clients share 100: the
  // fair share is 25 each, so left holds 75 and right 25.
  line_client a(left.address()), b(left.address()), c(left.address()), d(right.address());
  std::map<std::string, double> got;
  const bool converged = eventually([&] {
    got["a"] = gets(a.call("get_capacity", capacity_params("a", "db", 30)));
    got["b"] = gets(b.call("get_capacity", capacity_params("b", "db", 30)));
    got["c"] = gets(c.call("get_capacity", capacity_params("c", "db", 30)));
    got["d"] = gets(d.call("get_capacity", capacity_params("d", "db", 60)));
    const auto near = [](double x, double y) { return std::abs(x - y) < 1e-6; };
    return near(got["a"], 25) && near(got["b"], 25) && near(got["c"], 25) && near(got["d"], 25);
  });
  INFO("a=" << got["a"] << " b=" << got["b"] << " c=" << got["c"] << " d=" << got["d"]);
  CHECK(converged);
  CHECK(capacity_at(left.address(), "db") == Approx(75));
  CHECK(capacity_at(right.address(), "db") == Approx(25));
  const json st = status_of(left.address(), "db");
  CHECK(st["role"] == "intermediate");
  CHECK(st["level"] == 1);
  CHECK(st["parent"] == root.address());
  CHECK(st["resources"][0]["algorithm"] == "FAIR_SHARE");
  const json rs = status_of(root.address(), "db");
  CHECK(rs["resources"][0]["sum_has"].get<double>() <= 100 + 1e-9);
  CHECK(rs["resources"][0]["subclients"] == 4);
}

TEST_CASE("an intermediate losing its parent runs dry, then recovers", "[net][tree]") {
  auto root = std::make_unique<running_node<>>(fast_config(50));
  const std::string root_address = root->address();
  doorman::node_options mid;
  mid.parents = {root_address};
  running_node left("", mid);
  line_client a(left.address());
  REQUIRE(eventually(
      [&] { return gets(a.call("get_capacity", capacity_params("a", "db", 20))) == 20; }));

  root.reset();  // the parent goes away
  // The intermediate's lease (3 s) runs out; so do the grants it made, which never outlived it.
  REQUIRE(eventually([&] { return capacity_at(left.address(), "db") == 0; }, 8s));
  CHECK(gets(a.call("get_capacity", capacity_params("a", "db", 20))) == 0);

  doorman::node_options back;
  back.listen = root_address;  // the parent returns at the same address
  running_node again(fast_config(50), back);
  CHECK(eventually(
      [&] { return gets(a.call("get_capacity", capacity_params("a", "db", 20))) == 20; }));
}

TEST_CASE("a restarted root rebuilds its leases in learning mode without over-granting",
          "[net][tree]") {
  const double capacity = 90;
  auto root = std::make_unique<running_node<>>(fast_config(capacity, 1.5));
  const std::string address = root->address();
  std::vector<std::unique_ptr<line_client>> clients;
  std::vector<json> has(3);
  for (int i = 0; i < 3; ++i)
    clients.push_back(std::make_unique<line_client>(address));
  // Learning mode at first start: newcomers get 0; after it they share 90 (30 each).
  REQUIRE(eventually([&] {
    bool all = true;
    for (int i = 0; i < 3; ++i) {
      const json r =
          clients[i]->call("get_capacity", capacity_params("c" + std::to_string(i), "db", 50));
      has[i] = r["result"]["resources"][0]["gets"];
      all = all && has[i]["capacity"] == 30;
    }
    return all;
  }));

  root.reset();
  doorman::node_options again;
  again.listen = address;
  running_node restarted(fast_config(capacity, 1.5), again);
  // Clients come back reporting what they have; during learning mode the root confirms it,
  // and the sum never exceeds the capacity.
  bool saw_learning = false;
  const bool settled = eventually([&] {
    double sum = 0;
    for (int i = 0; i < 3; ++i) {
      line_client c(address);
      const json r =
          c.call("get_capacity", capacity_params("c" + std::to_string(i), "db", 50, has[i]));
      has[i] = r["result"]["resources"][0]["gets"];
      sum += has[i]["capacity"].get<double>();
    }
    const json st = status_of(address, "db");
    CHECK(st["resources"][0]["sum_has"].get<double>() <= capacity + 1e-9);
    CHECK(sum <= capacity + 1e-9);
    if (st["resources"][0]["learning"] == true) saw_learning = true;
    return st["resources"][0]["learning"] == false && sum == Approx(capacity);
  });
  CHECK(saw_learning);
  CHECK(settled);
}

TEST_CASE("a root with a state file grants at once when no lease it granted is out",
          "[net][tree][state]") {
  const std::string dir = scratch_directory("doorman-state");
  const std::string path = dir + "/state.json";
  doorman::node_options o;
  o.state_file = path;
  const auto asks = [](const std::string& address) {
    line_client c(address);
    return gets(c.call("get_capacity", capacity_params("c", "db", 50)));
  };
  const auto learning = [](const std::string& address) {
    return status_of(address, "db")["resources"][0]["learning"] == true;
  };
  {  // Fresh: no file, so no lease out. Learning mode would give a newcomer 0 for 1.5 s.
    running_node root(fast_config(90, 1.5), o);
    CHECK(asks(root.address()) == 50);
    CHECK_FALSE(learning(root.address()));
  }
  // The file says how far the leases may last: written ahead, three lease lengths (3 s each).
  const auto now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto read = [&] {
    std::ifstream in(path);
    return json::parse(in);
  };
  CHECK(read()["leases_until"].get<double>() > now + 6);
  CHECK(read()["leases_until"].get<double>() < now + 10);
  {  // Restarted at once: a lease may be out, so it learns.
    running_node root(fast_config(90, 1.5), o);
    CHECK(asks(root.address()) == 0);
    CHECK(learning(root.address()));
  }
  {  // A file whose leases have ended: at once again.
    std::ofstream(path) << R"({"leases_until": 1000, "budgets": {}})";
    running_node root(fast_config(90, 1.5), o);
    CHECK(asks(root.address()) == 50);
  }
  // Hostile files are refused naming the field, and left as they were.
  for (const std::string bad : {R"({"leases_until": "soon"})", R"([1])",
                                R"({"leases_until": 1, "budgets": {"b": {"window": 1}}})"}) {
    std::ofstream(path) << bad;
    try {
      running_node root(fast_config(90, 1.5), o);
      FAIL("a bad state file was accepted: " << bad);
    } catch (const std::runtime_error& e) {
      CHECK_THAT(e.what(), Catch::Matchers::StartsWith("state file " + path + ": "));
    }
    std::ifstream in(path);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == bad);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a root whose state file cannot be written steps down when it stops covering, and back",
          "[net][tree][state]") {
  const std::string dir = scratch_directory("doorman-state");
  doorman::node_options o;
  o.state_file = dir + "/state.json";
  std::vector<std::string> lines;
  std::mutex m;
  o.log = [&](std::string_view line) {
    const std::lock_guard lock(m);
    lines.emplace_back(line);
  };
  const auto logged = [&](std::string_view what) {
    const std::lock_guard lock(m);
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  running_node root(fast_config(90, 1.5), o);
  line_client c(root.address());
  const auto master = [&] {
    return c.call("get_capacity",
                  capacity_params("c", "db", 50))["result"]["mastership"]["is_master"] == true;
  };
  REQUIRE(master());
  // The file written three lease lengths (3 s) ahead; now every write fails (a directory
  // stands where its temporary file goes: refused to root too).
  std::filesystem::create_directory(o.state_file + ".new");
  const auto failing = std::chrono::steady_clock::now();
  REQUIRE(eventually([&] { return !master(); }, 12s));
  // Not before what the file covers ran out (6 s of term from the last write, less the time
  // it took to get here).
  CHECK(std::chrono::steady_clock::now() - failing > 4s);
  CHECK(logged("warning: state file " + o.state_file + ": cannot create"));
  // The step-down names its cause (not a paused process's lost election term).
  CHECK(logged("warning: what state file " + o.state_file + " covers has run out"));
  CHECK_FALSE(logged("the election term ended before a renewal was confirmed"));
  // Writable again: master at the next call, in learning mode (its leases were forgotten).
  std::filesystem::remove(o.state_file + ".new");
  REQUIRE(eventually(master, 5s));
  CHECK(logged("state file written again after the term ended; learning mode starts"));
  CHECK(status_of(root.address(), "db")["resources"][0]["learning"] == true);
  std::filesystem::remove_all(dir);
}

#ifdef DOORMAN_NODE_BINARY

TEST_CASE("doorman-node processes: a tree, SIGHUP reload good and bad, SIGTERM", "[net][process]") {
  char dir_template[] = "/tmp/doorman-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string config = std::string(dir_template) + "/resources.json";
  std::ofstream(config) << fast_config(100);

  const std::string dir = dir_template;
  process root({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config", config,
                "--minimum-refresh-interval", "0"},
               dir + "/root.log");
  const std::string root_address = listening_address(root);
  process mid({DOORMAN_NODE_BINARY, "--listen=127.0.0.1:0", "--parent", root_address},
              dir + "/mid.log");
  const std::string mid_address = listening_address(mid);

  line_client a(mid_address);
  CHECK(eventually(
      [&] { return gets(a.call("get_capacity", capacity_params("a", "db", 150))) == 100; }));
  CHECK(mid.wait_for("parent " + root_address + " reached"));

  // A good reload: capacity 60 applies, the lease stays.
  std::ofstream(config) << fast_config(60);
  root.signal(SIGHUP);
  REQUIRE(root.wait_for("configuration reloaded"));
  CHECK(eventually(
      [&] { return gets(a.call("get_capacity", capacity_params("a", "db", 150))) == 60; }));
  CHECK(status_of(root_address, "db")["resources"][0]["clients"] == 1);

  // A bad one: rejected with the field named, the old configuration stays.
  check_bad_config_kept(root, root_address, 60, [&](const std::string& text) {
    std::ofstream(config) << text;
    root.signal(SIGHUP);
  });

  mid.signal(SIGTERM);
  CHECK(mid.exits_cleanly());
  root.signal(SIGINT);
  CHECK(root.exits_cleanly());
  std::filesystem::remove_all(dir);
}

TEST_CASE("doorman-node on SIGTERM: answers what it computed, within --drain-timeout",
          "[net][process]") {
  char dir_template[] = "/tmp/doorman-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string dir = dir_template;
  const std::string config = dir + "/resources.json";
  std::ofstream(config) << fast_config(100);
  process node(
      {DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config", config, "--drain-timeout", "1"},
      dir + "/node.log");
  const std::string address = listening_address(node);

  // A peer that pipelines requests and never reads its answers, until the node stops reading
  // it (1.5 s without a byte taken): its answers fill the socket buffers, and what the node
  // computed for it cannot be written. (Half a second was too short under ThreadSanitizer: a
  // node merely slow to read looked stalled, then caught up, its answers all in the buffers.)
  line_client stuck(address);
  std::string flood;
  for (int i = 0; i < 2000; ++i) {
    flood += request_line(i, "get_capacity", capacity_params("stuck", "db", 1));
  }
  REQUIRE(stuck.flood_until_stalled(flood, 1500ms));
  // A peer that behaves: its answer is written before the node goes.
  line_client polite(address);
  REQUIRE(gets(polite.call("get_capacity", capacity_params("polite", "db", 5))) == 5);
  CHECK(eventually([&] { return status_of(address, "db")["resources"][0]["clients"] == 2; }));

  const auto stopped_at = steady::now();
  node.signal(SIGTERM);
  CHECK(node.exits_cleanly());
  const double took = std::chrono::duration<double>(steady::now() - stopped_at).count();
  std::printf("doorman-node stopped %.2f s after SIGTERM (--drain-timeout 1)\n", took);
  // The stuck peer holds the node for the drain timeout, not longer (and not forever).
  CHECK(took >= 0.9);
  CHECK(took < 3.0);
  CHECK(polite.closed_by_peer());
  CHECK(node.log().find("closing 1 connection whose answers were not taken within 1 s") !=
        std::string::npos);
  std::filesystem::remove_all(dir);
}

namespace {

// A directory laid out as Kubernetes mounts a ConfigMap: `name` -> `..data/name`, `..data` ->
// a directory of the version; `publish` swaps `..data` to a new version at once (a rename).
struct configmap_dir {
  explicit configmap_dir(std::filesystem::path d) : dir(std::move(d)) {}
  void publish(const std::string& name, const std::string& text) {
    const auto version = dir / ("..v" + std::to_string(++versions));
    std::filesystem::create_directories(version);
    std::ofstream(version / name) << text;
    std::filesystem::create_directory_symlink(version.filename(), dir / "..data_tmp");
    std::filesystem::rename(dir / "..data_tmp", dir / "..data");
    if (!std::filesystem::is_symlink(dir / name)) {
      std::filesystem::create_symlink(std::filesystem::path("..data") / name, dir / name);
    }
  }
  std::filesystem::path dir;
  int versions = 0;
};

}  // namespace

TEST_CASE("file_watch: a rewrite, a symlink swap, a missing file", "[node]") {
  char dir_template[] = "/tmp/doorman-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  configmap_dir cm(dir_template);
  cm.publish("config.yaml", "a: 1\n");
  const std::string plain = cm.dir / "plain.json";
  std::ofstream(plain) << "{}";
  const std::string config = cm.dir / "config.yaml";
  const std::string gone = cm.dir / "gone.pem";
  std::ofstream(gone) << "pem";
  doorman::file_watch watch({config, "", plain, gone});
  CHECK(watch.size() == 3);
  const auto at_start = watch.version();  // what its construction saw
  CHECK(at_start != 0);
  auto look = watch.look();
  CHECK(look.version == at_start);
  CHECK(look.changed.empty());
  const auto first = look.version;
  CHECK(watch.look().version == first);  // nothing changed, the same version

  cm.publish("config.yaml", "a: 2\n");  // same size, another file behind the same path
  look = watch.look();
  CHECK(look.changed == std::vector<std::string>{config});
  CHECK(look.version != first);
  CHECK(watch.look().changed.empty());

  std::ofstream(plain) << "{\"a\": 1}";  // rewritten in place
  std::ofstream(gone) << "pem2";         // and another
  CHECK(watch.look().changed == std::vector<std::string>{plain, gone});
  std::filesystem::remove(gone);  // missing: no version, the path named
  look = watch.look();
  REQUIRE(look.unreachable);
  CHECK(*look.unreachable == gone + ": cannot be reached");
  CHECK(watch.version() == 0);
  std::filesystem::remove_all(cm.dir);
}

TEST_CASE("file_watch: a directory's files, added, rewritten and removed", "[node]") {
  char dir_template[] = "/tmp/doorman-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::filesystem::path dir = dir_template;
  std::ofstream(dir / "a.yaml") << "a";
  std::ofstream(dir / "notes.txt") << "not watched";
  auto watch = doorman::file_watch::directory(dir.string(), {".yaml", ".yml"});
  const auto first = watch.look().version;
  std::ofstream(dir / "notes.txt") << "still not watched";
  CHECK(watch.look().version == first);
  std::ofstream(dir / "b.yml") << "b";
  auto look = watch.look();
  CHECK(look.changed == std::vector<std::string>{(dir / "b.yml").string()});
  std::filesystem::remove(dir / "a.yaml");
  look = watch.look();
  CHECK(look.changed == std::vector<std::string>{(dir / "a.yaml").string()});
  CHECK(look.version != first);
  std::filesystem::remove_all(dir);
  look = watch.look();
  REQUIRE(look.unreachable);
  CHECK_THAT(*look.unreachable, Catch::StartsWith(dir.string() + ": "));
}

TEST_CASE("doorman-node follows its configuration through a ConfigMap's symlink swap",
          "[net][process]") {
  char dir_template[] = "/tmp/doorman-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  configmap_dir cm(dir_template);
  cm.publish("resources.json", fast_config(100));
  process node({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config",
                (cm.dir / "resources.json").string(), "--reload-interval", "0.1"},
               (cm.dir / "node.log").string());
  const std::string address = listening_address(node);
  CHECK(capacity_at(address, "db") == 100);

  // A new version, no signal: read within the interval, as SIGHUP reads it.
  cm.publish("resources.json", fast_config(60));
  REQUIRE(node.wait_for("resources.json changed: reloading", 5s));
  REQUIRE(node.wait_for("configuration reloaded", 5s));
  CHECK(capacity_at(address, "db") == 60);

  // A bad version: rejected once, naming the field; the good one stays.
  check_bad_config_kept(node, address, 60,
                        [&](const std::string& text) { cm.publish("resources.json", text); });

  node.signal(SIGTERM);
  CHECK(node.exits_cleanly());
  const auto log = node.log();
  std::size_t reloads = 0;
  for (auto at = log.find("changed: reloading"); at != std::string::npos;
       at = log.find("changed: reloading", at + 1)) {
    ++reloads;
  }
  CHECK(reloads == 2);  // one per version, not one per look
  std::filesystem::remove_all(cm.dir);
}

TEST_CASE("doorman-node refuses bad flags with a message", "[net][process]") {
  const auto log = (std::filesystem::temp_directory_path() / "doorman-test-flags.log").string();
  const std::string node = DOORMAN_NODE_BINARY;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--listen", "nowhere", "--parent", "127.0.0.1:1"},
       "--listen: expected host:port, got \"nowhere\""},
      {{"--listen", "127.0.0.1:0", "--parent", "a:1,b"}, "--parent: expected host:port, got \"b\""},
      {{"--listen", "127.0.0.1:0"}, "--config is required"},
      {{"--parent", "127.0.0.1:1", "--etcd-endpoints", "http://127.0.0.1:2379,bad"},
       "--etcd-endpoints: expected host:port, got \"bad\""},
      {{"--parent", "127.0.0.1:1", "--etcd-endpoints", "127.0.0.1:2379", "--election-ttl", "2.5"},
       "--election-ttl: expected whole seconds"},
      {{"--config", "etcd:/doorman/config"}, "--config etcd:KEY needs --etcd-endpoints"},
      // The election's flags are checked without etcd too (they were taken unread).
      {{"--listen", "127.0.0.1:0", "--parent", "127.0.0.1:1", "--budget-mark-step", "abc"},
       "--budget-mark-step: expected a number in [0, 1]"},
      {{"--listen", "127.0.0.1:0", "--parent", "127.0.0.1:1", "--election-ttl", "1e9"},
       "--election-ttl: expected a number in [2, 86400]"},
  };
  for (auto [flags, message] : cases) {
    flags.insert(flags.begin(), node);
    check_refused_start(flags, log, message);
  }
  std::filesystem::remove(log);
}

TEST_CASE("doorman-node reads its flags from DOORMAN_<FLAG> variables", "[net][process]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("doorman-test-env-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "conf.json") << fast_config(10);
  // The spawned process inherits this test process's environment.
  ::setenv("DOORMAN_LISTEN", "127.0.0.1:0", 1);
  ::setenv("DOORMAN_CONFIG", ("file:" + (dir / "conf.json").string()).c_str(), 1);
  {
    process p({DOORMAN_NODE_BINARY}, (dir / "good.log").string());
    doorman_test::listening_address(p);  // SIGTERM is handled by then
    p.signal(SIGTERM);
    CHECK(p.exits_cleanly());
  }
  ::setenv("DOORMAN_DECAY_FACTOR", "7", 1);
  check_refused_start({DOORMAN_NODE_BINARY}, (dir / "bad.log").string(),
                      "--decay-factor: expected a number in [0.001, 1]");
  ::unsetenv("DOORMAN_DECAY_FACTOR");
  ::unsetenv("DOORMAN_CONFIG");
  ::unsetenv("DOORMAN_LISTEN");
  std::filesystem::remove_all(dir);
}

#endif

TEST_CASE("a node that cannot bind says so, as an error_code or an exception", "[net][node]") {
  running_node first(fast_config(10));
  asio::io_context io;
  doorman::node_options o;
  o.listen = first.address();  // taken
  doorman::node second(io.get_executor(), doorman::engine::parse_config(fast_config(10)), o);
  std::error_code ec;
  second.start(ec);
  CHECK(ec == asio::error::address_in_use);
  doorman::node third(io.get_executor(), doorman::engine::parse_config(fast_config(10)), o);
  try {
    third.start();
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(e.code() == asio::error::address_in_use);
    CHECK_THAT(e.what(), Catch::Contains("listening on " + first.address()));
  }
}

namespace {

// An election that keeps renewing: master, its term always a second ahead.
struct renewing_election {
  void start(std::string advertise, doorman::mastership_callback cb) { cb(true, advertise); }
  void stop() {}
  [[nodiscard]] std::chrono::steady_clock::time_point valid_until() const {
    return std::chrono::steady_clock::now() + 1s;
  }
};

}  // namespace

TEST_CASE("fencing: a master whose term keeps being renewed never steps down, idle or not",
          "[node][election]") {
  running_node<> root(fast_config(100));
  doorman::node_options o;
  o.parents = {root.address()};
  o.admin = "127.0.0.1:0";
  running_node<renewing_election> mid("", o);
  line_client c(mid.address());
  (void)c.call("get_capacity", capacity_params("a", "db", 10));
  // No client asks for 2.5 s; the upstream loop goes on talking to the parent (it used to
  // decide with the term the node had seen at its last client request, a second later over).
  std::this_thread::sleep_for(2500ms);  // the idle stretch under test, not a synchronization
  const auto metrics = http_get(mid.node().admin_address(), "/metrics").body;
  CHECK_THAT(metrics, Catch::Contains("doorman_mastership_fenced_total 0"));
}
