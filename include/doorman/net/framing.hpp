#pragma once

/// \file
/// What every link of doorman reads and times the same way, written once: newline-delimited
/// messages with a length limit (`line_buffer`, used by the server and the channel), and a
/// deadline over an exchange of several steps, kept by closing its socket (`socket_deadline`,
/// used by the channel's connect and the HTTP client).
///
///     net::line_buffer in(max_message_bytes);
///     in.commit(co_await socket.async_read_some(in.prepare(), asio::use_awaitable));
///     while (auto line = in.next_line()) handle(*line);
///     if (in.too_long()) ... refuse and close;
///     in.compact();  // before reading more

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstring>
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
///
/// Reads go straight into the buffer (`prepare`, then `commit`), which is sized to what the
/// peer sends: the first read is offered 512 bytes, and each read that fills what it was offered
/// doubles the next offer, up to 16 KiB. So a connection that sends one short request at a time
/// holds 512 bytes, and a pipelining one reads 16 KiB at a time. A buffer grown past 64 KiB by
/// a long message is given back once that message is handled.
class line_buffer {
 public:
  static constexpr std::size_t first_read = 512;
  static constexpr std::size_t largest_read = 16384;

  explicit line_buffer(std::size_t limit) noexcept : limit_(limit) {}

  /// Room at the end for the next read to fill: the current offer; then `commit`.
  [[nodiscard]] asio::mutable_buffer prepare() {
    reserve(size_ + read_size_);
    return {data_.get() + size_, read_size_};
  }

  /// Adds the `n` bytes (at most the offer) the last read put in the room `prepare` gave.
  void commit(std::size_t n) noexcept {
    assert(n <= read_size_);
    size_ += n;
    if (n == read_size_ && read_size_ < largest_read) read_size_ *= 2;
  }

  /// Adds bytes read elsewhere.
  void append(std::string_view data) {
    reserve(size_ + data.size());
    if (!data.empty()) std::memcpy(data_.get() + size_, data.data(), data.size());
    size_ += data.size();
  }

  /// The next complete line, without its '\n' (valid until `append`, `prepare` or `compact`);
  /// nothing when no complete line is left or the limit was passed.
  [[nodiscard]] std::optional<std::string_view> next_line() {
    if (too_long_) return std::nullopt;
    const std::string_view held(data_.get(), size_);
    const auto nl = held.find('\n', std::max(start_, scanned_));
    if (nl == std::string_view::npos) {
      scanned_ = size_;
      too_long_ = size_ - start_ > limit_;
      return std::nullopt;
    }
    if (nl - start_ > limit_) {
      too_long_ = true;
      return std::nullopt;
    }
    const std::string_view line = held.substr(start_, nl - start_);
    start_ = scanned_ = nl + 1;
    ++lines_;
    return line;
  }

  /// Whether a line longer than the limit was met.
  [[nodiscard]] bool too_long() const noexcept { return too_long_; }

  /// Lines handed out so far.
  [[nodiscard]] std::size_t lines() const noexcept { return lines_; }

  /// Bytes allocated for the stream.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// Forgets the lines already handed out.
  void compact() noexcept {
    if (start_ > 0 && size_ > start_)
      std::memmove(data_.get(), data_.get() + start_, size_ - start_);
    size_ -= start_;
    scanned_ -= start_;
    start_ = 0;
    if (size_ == 0 && capacity_ > 4 * largest_read) {
      data_.reset();
      capacity_ = 0;
    }
  }

 private:
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    const std::size_t c = std::max(n, capacity_ * 2);
    auto grown = std::make_unique_for_overwrite<char[]>(c);
    if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
    data_ = std::move(grown);
    capacity_ = c;
  }

  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  std::size_t read_size_ = first_read;  // what the next read is offered
  std::size_t start_ = 0;               // where the next line starts
  std::size_t scanned_ = 0;             // bytes known to hold no newline
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
