#pragma once

/// \file
/// The coroutines of net::server, and what spawns them (declared in <doorman/net/server.hpp>):
/// included by that header when header-only, compiled once by <doorman/src.hpp> under
/// DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/server.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<bool> server::session::handshake(std::shared_ptr<session> self) {
  if (!self->peer_.secure) co_return true;
  std::error_code ec;
  co_await self->stream_.handshake(tls_side::server, {}, ec);
  if (self->closed_) co_return false;
  if (ec) {
    ++self->owner_.counts_.failed_handshakes;
    self->owner_.warn(self->owner_.handshake_log_,
                      fmt::format("warning: TLS handshake with {} failed: {}", self->peer_.address,
                                  self->stream_.failure(ec)));
    self->close();
    co_return false;
  }
  self->peer_.identity = self->stream_.identity();
  self->handshaken_ = true;
  self->touch();
  co_return true;
}

DOORMAN_DECL asio::awaitable<void> server::session::read_loop(std::shared_ptr<session> self) {
  if (!co_await handshake(self)) co_return;
  line_buffer in(self->owner_.options_.max_message_bytes);
  while (!self->closed_ && !self->stopping_) {
    // Answer every complete line already read, a batch at a time.
    const std::size_t answered = in.lines();
    const std::size_t limit = self->owner_.options_.max_in_flight;
    for (;;) {
      const std::size_t used = self->queued_ + self->in_write_;
      if (!self->take_lines(in, used < limit ? limit - used : 1)) break;
      self->queued_ += self->owner_.handler_(self->batch_, self->peer_, self->out_);
      if (self->queued_ + self->in_write_ >= limit) {
        self->flush();
        // Backpressure: read no further until the peer has taken some answers.
        while (!self->closed_ && self->queued_ + self->in_write_ >= limit) {
          self->drained_.expires_at(clock::time_point::max());
          std::error_code ec;
          co_await self->drained_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        }
        if (self->closed_ || self->stopping_) co_return;
      }
    }
    if (in.too_long()) {
      self->too_long();
      co_return;
    }
    if (in.lines() != answered) self->touch();  // one clock read per batch, not per line
    in.compact();
    self->flush();

    std::error_code ec;
    const std::size_t n = co_await self->stream_.async_read_some(
        in.prepare(), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      // The peer closed (or the socket was closed): write what is left, then close.
      self->stopping_ = true;
      self->flush();
      co_return;
    }
    in.commit(n);
  }
}

DOORMAN_DECL asio::awaitable<void> server::session::write_loop(std::shared_ptr<session> self) {
  std::string buffer;
  while (!self->closed_ && !self->out_.empty()) {
    std::swap(buffer, self->out_);
    self->in_write_ = self->queued_;
    self->queued_ = 0;
    std::error_code ec;
    co_await asio::async_write(self->stream_, asio::buffer(buffer),
                               asio::redirect_error(asio::use_awaitable, ec));
    buffer.clear();
    self->in_write_ = 0;
    self->drained_.cancel();
    if (ec) {
      self->close();
      co_return;
    }
  }
  self->writing_ = false;
  if (self->stopping_) self->close();
}

DOORMAN_DECL asio::awaitable<void> server::session::watchdog(std::shared_ptr<session> self) {
  while (!self->closed_) {
    self->idle_.expires_at(self->deadline_);
    std::error_code ec;
    co_await self->idle_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (self->closed_) co_return;
    if (clock::now() >= self->deadline_) {
      if (self->peer_.secure && !self->handshaken_) {
        ++self->owner_.counts_.failed_handshakes;
        self->owner_.warn(
            self->owner_.handshake_log_,
            fmt::format("warning: TLS handshake with {} timed out; closing", self->peer_.address));
      } else {
        ++self->owner_.counts_.closed_idle;
        self->owner_.warn(self->owner_.idle_log_,
                          fmt::format("closing an idle connection from {}", self->peer_.address));
      }
      self->close();
      co_return;
    }
  }
}
DOORMAN_DECL void server::session::start() {
  if (peer_.secure) {
    deadline_ =
        clock::now() + to_duration<clock::duration>(owner_.options_.handshake_timeout.count());
  } else {
    touch();
    // flush() writes plaintext answers straight away and must not block doing it.
    std::error_code ec;
    stream_.socket().non_blocking(true, ec);
  }
  asio::co_spawn(executor_, read_loop(shared_from_this()), asio::detached);
  asio::co_spawn(executor_, watchdog(shared_from_this()), asio::detached);
}

DOORMAN_DECL void server::session::flush() {
  if (closed_ || writing_) return;
  if (!out_.empty() && !peer_.secure) {
    // Plaintext: hand the answers to the kernel now, in one call (a non-blocking send that
    // nearly always takes them all); a coroutine writes only what it leaves.
    std::error_code ec;
    const std::size_t n = stream_.socket().write_some(asio::buffer(out_), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      close();
      return;
    }
    if (n == out_.size()) {
      out_.clear();
      queued_ = 0;
    } else {
      out_.erase(0, n);
    }
  }
  if (out_.empty()) {
    if (stopping_) close();
    return;
  }
  writing_ = true;
  asio::co_spawn(executor_, write_loop(shared_from_this()), asio::detached);
}

}  // namespace doorman::net
