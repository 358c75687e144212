#include "tapegrad/tensor/io/detail/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::io {

namespace {

[[noreturn]] void fail(std::string_view op, const std::string& what, const std::filesystem::path& path, int error) {
  throw Error(detail::concat(op, ": ", what, " '", path.string(), "': ", std::strerror(error)));
}

class DescriptorSink final : public FileSink {
 public:
  DescriptorSink(int fd, std::string_view op, const std::filesystem::path& path) : fd_(fd), op_(op), path_(path) {}
  void write(const void* bytes, std::size_t count) override {
    const char* at = static_cast<const char*>(bytes);
    while (count > 0) {  // write may take fewer bytes than asked, or be interrupted
      const ssize_t done = ::write(fd_, at, count);
      if (done < 0 && errno == EINTR) continue;
      if (done < 0) fail(op_, "cannot write", path_, errno);
      at += done;
      count -= static_cast<std::size_t>(done);
    }
  }

 private:
  int fd_;
  std::string_view op_;
  const std::filesystem::path& path_;
};

// Removes the temporary file unless released: on every way out of write_atomically but success.
struct TemporaryFile {
  std::string path;
  int fd = -1;
  ~TemporaryFile() {
    if (fd >= 0) ::close(fd);
    if (!path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

void write_atomically(const std::filesystem::path& path, const std::function<void(FileSink&)>& fill,
                      std::string_view op) {
  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  TemporaryFile temporary;
  std::string hidden = ".";
  hidden += path.filename().string();
  hidden += ".tmp-XXXXXX";
  const std::string pattern = (folder / hidden).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  temporary.fd = ::mkstemp(name.data());
  if (temporary.fd < 0) fail(op, "cannot create a temporary file beside", path, errno);
  temporary.path = name.data();
  DescriptorSink sink(temporary.fd, op, path);
  fill(sink);
  // The target's permissions where it exists (mkstemp makes the file private), else rw-r--r--.
  std::error_code no_target;
  const auto status = std::filesystem::status(path, no_target);
  const auto mode =
      no_target || !std::filesystem::exists(status) ? 0644 : static_cast<int>(status.permissions()) & 07777;
  if (::fchmod(temporary.fd, static_cast<mode_t>(mode)) != 0) fail(op, "cannot set the permissions of", path, errno);
  if (::fsync(temporary.fd) != 0) fail(op, "cannot flush", path, errno);
  const int fd = temporary.fd;
  temporary.fd = -1;
  if (::close(fd) != 0) fail(op, "cannot close", path, errno);
  if (::rename(temporary.path.c_str(), path.c_str()) != 0) fail(op, "cannot rename the temporary file to", path, errno);
  temporary.path.clear();  // it is the target now
  // The rename is durable once the folder's entry is on the disk.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0) fail(op, "cannot open the folder of", path, errno);
  const int synced = ::fsync(dir);
  const int error = errno;
  ::close(dir);
  if (synced != 0) fail(op, "cannot flush the folder of", path, error);
}

}  // namespace tapegrad::io
