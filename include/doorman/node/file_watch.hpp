#pragma once

/// \file
/// Noticing that a file the node reads has changed, without reading it: the file's stamp
/// (the file a path finally names once every symlink is followed, its device and inode, its
/// size and modification time) taken again and compared. Kubernetes changes a mounted
/// ConfigMap or Secret by swapping a symlink (`..data`) to a new directory and sends no
/// signal: the path stays, what it names changes, and so does its stamp.
///
///     doorman::file_watch watch({"/etc/doorman/resources.yaml", "/etc/doorman/tls/tls.crt"});
///     // every second:
///     if (const auto changed = watch.changed(); !changed.empty()) reload();

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <string>
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

/// A set of files watched together (empty paths are ignored).
class file_watch {
 public:
  /// Takes the files' stamps as they are now: a change is counted from here.
  explicit file_watch(std::vector<std::string> paths) {
    for (auto& p : paths) {
      if (p.empty()) continue;
      auto s = stamp_of(p);
      files_.emplace_back(std::move(p), std::move(s));
    }
  }

  /// The paths whose stamp changed since the last look, in the order given. A file that
  /// cannot be reached counts as changed only once it is back with another stamp (a swap
  /// does not leave the path missing; a missing file is for the reload to report, if ever).
  [[nodiscard]] std::vector<std::string> changed() {
    std::vector<std::string> out;
    for (auto& [path, last] : files_) {
      auto now = stamp_of(path);
      if (!now.exists) continue;
      if (now != last) out.push_back(path);
      last = std::move(now);
    }
    return out;
  }

  [[nodiscard]] std::size_t size() const noexcept { return files_.size(); }

 private:
  std::vector<std::pair<std::string, file_stamp>> files_;
};

}  // namespace doorman
