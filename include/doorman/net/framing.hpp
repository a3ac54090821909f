#pragma once

/// \file
/// What every link of doorman reads and times the same way, written once: newline-delimited
/// messages with a length limit (`line_buffer`, used by the server and the channel), and a
/// deadline over an exchange of several steps, kept by closing its socket (`socket_deadline`,
/// used by the channel's connect and the HTTP client).
///
///     net::line_buffer in(max_message_bytes);
///     in.append(std::string_view(chunk.data(), n));
///     while (auto line = in.next_line()) handle(*line);
///     if (in.too_long()) ... refuse and close;
///     in.compact();  // before reading more

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <asio.hpp>

namespace doorman::net {

/// A byte stream cut into lines at '\n'. A line (or the unfinished rest) longer than the limit
/// stops the reading: `too_long()` is then true for good. Each byte is scanned once however
/// the stream is cut into reads.
class line_buffer {
 public:
  explicit line_buffer(std::size_t limit) noexcept : limit_(limit) {}

  /// Adds bytes read from the stream.
  void append(std::string_view data) { in_.append(data); }

  /// The next complete line, without its '\n' (valid until `append` or `compact`); nothing when
  /// no complete line is left or the limit was passed.
  [[nodiscard]] std::optional<std::string_view> next_line() {
    if (too_long_) return std::nullopt;
    const auto nl = in_.find('\n', std::max(start_, scanned_));
    if (nl == std::string::npos) {
      scanned_ = in_.size();
      too_long_ = in_.size() - start_ > limit_;
      return std::nullopt;
    }
    if (nl - start_ > limit_) {
      too_long_ = true;
      return std::nullopt;
    }
    const std::string_view line = std::string_view(in_).substr(start_, nl - start_);
    start_ = scanned_ = nl + 1;
    ++lines_;
    return line;
  }

  /// Whether a line longer than the limit was met.
  [[nodiscard]] bool too_long() const noexcept { return too_long_; }

  /// Lines handed out so far.
  [[nodiscard]] std::size_t lines() const noexcept { return lines_; }

  /// Forgets the lines already handed out.
  void compact() {
    in_.erase(0, start_);
    scanned_ -= start_;
    start_ = 0;
  }

 private:
  std::string in_;
  std::size_t start_ = 0;    // where the next line starts
  std::size_t scanned_ = 0;  // bytes of in_ known to hold no newline
  std::size_t lines_ = 0;
  std::size_t limit_;
  bool too_long_ = false;
};

/// One deadline over the steps of an exchange (resolve, connect, write, read): at the
/// deadline, `close()` is called (which closes the socket, so that the step under way fails).
/// Destroying it first disarms it.
class socket_deadline {
 public:
  template <class Close>
  socket_deadline(const asio::any_io_executor& executor,
                  std::chrono::steady_clock::time_point deadline, Close close)
      : timer_(executor, deadline), state_(std::make_shared<state>()) {
    timer_.async_wait([s = state_, close = std::move(close)](std::error_code ec) mutable {
      if (ec || s->disarmed) return;
      s->expired = true;
      close();
    });
  }

  socket_deadline(const socket_deadline&) = delete;
  socket_deadline& operator=(const socket_deadline&) = delete;

  ~socket_deadline() {
    state_->disarmed = true;
    timer_.cancel();
  }

  /// Whether the deadline passed (and the socket was closed).
  [[nodiscard]] bool expired() const noexcept { return state_->expired; }

 private:
  struct state {
    bool expired = false;
    bool disarmed = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<state> state_;
};

}  // namespace doorman::net
