#pragma once

// A child process (POSIX) whose stderr goes to a log file, for the tree demo and the tests
// that run real doorman-node processes. Not part of the library.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace doorman_examples {

class process {
 public:
  /// Starts `args[0]` with `args`, its stderr and stdout appended to `log_path`. Nothing of the
  /// parent's output is inherited: a child left running by a parent that crashed (and so never
  /// killed it) holds no pipe that a test runner waits on.
  process(std::vector<std::string> args, std::string log_path) : log_path_(std::move(log_path)) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
  }
  process(const process&) = delete;
  process& operator=(const process&) = delete;
  ~process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  /// Everything the process wrote to stderr so far.
  [[nodiscard]] std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  /// Waits until a stderr line after the ones already matched contains `what`; returns it.
  std::optional<std::string> wait_for(
      const std::string& what, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const std::string text = log();
      for (std::size_t nl; (nl = text.find('\n', scanned_)) != std::string::npos;) {
        std::string line = text.substr(scanned_, nl - scanned_);
        scanned_ = nl + 1;
        if (line.find(what) != std::string::npos) return line;
      }
      if (std::chrono::steady_clock::now() >= deadline || !running()) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling period
    }
  }

  /// The address from the node's "listening on HOST:PORT" line.
  std::optional<std::string> listening_address() {
    const auto line = wait_for("listening on ");
    if (!line) return std::nullopt;
    return line->substr(line->rfind(' ') + 1);
  }

  /// Whether the process handles signal `s` right now: it catches it, or one of its threads
  /// blocks it (the way a process that waits for signals with sigtimedwait does: the waiting
  /// thread shows it unblocked while it waits). Linux: /proc/PID/task/*/status. A server should,
  /// before it says it is listening: a SIGTERM sent on that line must stop it gracefully.
  [[nodiscard]] bool handles(int s) const {
    unsigned long long mask = 0;
    std::error_code ec;
    for (const auto& task :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
      std::ifstream in(task.path() / "status");
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("SigCgt:", 0) == 0 || line.rfind("SigBlk:", 0) == 0)
          mask |= std::stoull(line.substr(7), nullptr, 16);
      }
    }
    return ((mask >> (s - 1)) & 1U) != 0;
  }

  /// The process id (-1 once it has exited and been reaped).
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  void signal(int s) const {
    if (pid_ > 0) ::kill(pid_, s);
  }

  [[nodiscard]] bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    return true;
  }

  /// Whether the process exits with status 0 by `timeout`. If not, its status and the end of its
  /// log go to stderr: a test's log is in its temporary folder, gone by the time anyone looks.
  bool exits_cleanly(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const int status = wait_exit(timeout);
    if (status == 0) return true;
    std::string text = log();
    constexpr std::size_t tail = 16'000;
    if (text.size() > tail) text.erase(0, text.size() - tail);
    std::fprintf(stderr, "--- %s: %s; the end of its log:\n%s--- end of %s\n", log_path_.c_str(),
                 status < 0 ? "still running" : ("exit status " + std::to_string(status)).c_str(),
                 text.c_str(), log_path_.c_str());
    return false;
  }

  /// The exit status (128 + signal when killed), or -1 if still running at the deadline.
  int wait_exit(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running()) {
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling period
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string log_path_;
  std::size_t scanned_ = 0;
};

}  // namespace doorman_examples
