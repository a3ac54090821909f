#pragma once

/// \file
/// Noticing that a file the node reads has changed, without reading it: the file's stamp
/// (the file a path finally names once every symlink is followed, its device and inode, its
/// size and modification time) taken again and compared. Kubernetes changes a mounted
/// ConfigMap or Secret by swapping a symlink (`..data`) to a new directory and sends no
/// signal: the path stays, what it names changes, and so does its stamp.
///
///     doorman::file_watch watch({"/etc/doorman/resources.yaml", "/etc/doorman/tls/tls.crt"});
///     auto look = watch.look();  // every second: look.version, for a config_follower
///
/// The version is what `config_follower` (core/config_follower.hpp) follows, as it follows an
/// etcd key's revision: one machine decides when a source changed, for every kind of source.

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace doorman {

/// What identifies a file's content without reading it.
struct file_stamp {
  bool exists = false;
  std::string target;  ///< the path with every symlink followed
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::int64_t size = 0;
  std::int64_t modified_ns = 0;  ///< modification time, nanoseconds since the epoch

  friend bool operator==(const file_stamp&, const file_stamp&) = default;
};

/// The stamp of `path` now; `exists` false when it cannot be reached.
[[nodiscard]] inline file_stamp stamp_of(const std::string& path) {
  file_stamp s;
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) return s;
  s.exists = true;
  std::error_code ec;
  s.target = std::filesystem::canonical(path, ec).string();
  s.device = static_cast<std::uint64_t>(st.st_dev);
  s.inode = static_cast<std::uint64_t>(st.st_ino);
  s.size = static_cast<std::int64_t>(st.st_size);
  s.modified_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
                  static_cast<std::int64_t>(st.st_mtim.tv_nsec);
  return s;
}

/// What one look at a set of files found: a version for `config_follower` (a digest of every
/// path and its stamp: a file added, removed, rewritten or swapped changes it), the paths whose
/// stamp changed since the last look that found them all, and those no longer listed (for the
/// log line), or the first one that cannot be reached.
struct files_look {
  std::int64_t version = 0;
  std::vector<std::string> changed;
  std::optional<std::string> unreachable;  ///< why the files cannot be looked at (then no version)
};

/// A set of files watched together: fixed paths (empty ones ignored), or the files of a
/// directory whose names end in one of the extensions given, listed again at every look.
class file_watch {
 public:
  /// The files at `paths`; their stamps as they are now count as seen (make the watch before
  /// the first read of the files: a change between the two is then seen at the next look).
  explicit file_watch(std::vector<std::string> paths) {
    for (auto& p : paths)
      if (!p.empty()) paths_.push_back(std::move(p));
    (void)look();
  }

  /// Every file of `dir` whose name ends in one of `extensions` (".yaml"), sorted by name.
  static file_watch directory(std::string dir, std::vector<std::string> extensions) {
    return file_watch(std::move(dir), std::move(extensions));
  }

  /// The files of `dir` whose names end in one of `extensions`, sorted; throws
  /// std::invalid_argument naming `dir` when it cannot be listed.
  [[nodiscard]] static std::vector<std::string> files_in(
      const std::string& dir, const std::vector<std::string>& extensions) {
    std::vector<std::string> out;
    std::error_code ec;
    const std::filesystem::directory_iterator files(dir, ec);
    if (ec) throw std::invalid_argument(dir + ": " + ec.message());
    for (const auto& e : files) {
      const auto ext = e.path().extension().string();
      if (e.is_regular_file(ec) &&
          std::find(extensions.begin(), extensions.end(), ext) != extensions.end())
        out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Looks at the files now.
  [[nodiscard]] files_look look() {
    files_look out;
    std::vector<std::string> paths;
    if (dir_.empty()) {
      paths = paths_;
    } else {
      try {
        paths = files_in(dir_, extensions_);
      } catch (const std::invalid_argument& e) {
        out.unreachable = e.what();
        version_ = 0;
        return out;
      }
    }
    std::vector<std::pair<std::string, file_stamp>> now;
    std::uint64_t digest = 14695981039346656037ULL;  // FNV-1a
    for (auto& p : paths) {
      auto s = stamp_of(p);
      if (!s.exists) {
        out.unreachable = p + ": cannot be reached";
        version_ = 0;
        return out;
      }
      for (const std::string_view part : {std::string_view(p), std::string_view(s.target)})
        digest = mix(digest, part.data(), part.size());
      for (const std::uint64_t x : {s.device, s.inode, static_cast<std::uint64_t>(s.size),
                                    static_cast<std::uint64_t>(s.modified_ns)})
        digest = mix(digest, &x, sizeof x);
      const auto before =
          std::find_if(seen_.begin(), seen_.end(), [&](const auto& e) { return e.first == p; });
      if (before == seen_.end() || before->second != s) out.changed.push_back(p);
      now.emplace_back(std::move(p), std::move(s));
    }
    for (const auto& [p, s] : seen_) {  // gone from a directory: changed too
      if (std::none_of(now.begin(), now.end(), [&](const auto& e) { return e.first == p; }))
        out.changed.push_back(p);
    }
    seen_ = std::move(now);
    out.version = static_cast<std::int64_t>(digest & 0x7fff'ffff'ffff'ffffULL);
    version_ = out.version;
    return out;
  }

  /// The version the last look found (0 when it could not look).
  [[nodiscard]] std::int64_t version() const noexcept { return version_; }

  /// The fixed paths watched (none for a directory).
  [[nodiscard]] std::size_t size() const noexcept { return paths_.size(); }

 private:
  file_watch(std::string dir, std::vector<std::string> extensions)
      : dir_(std::move(dir)), extensions_(std::move(extensions)) {
    (void)look();
  }

  static std::uint64_t mix(std::uint64_t h, const void* data, std::size_t n) noexcept {
    const auto* b = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i)
      h = (h ^ b[i]) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL;  // a separator: ("ab","c") is not ("a","bc")
  }

  std::int64_t version_ = 0;
  std::vector<std::string> paths_;
  std::string dir_;
  std::vector<std::string> extensions_;
  std::vector<std::pair<std::string, file_stamp>> seen_;
};

}  // namespace doorman
