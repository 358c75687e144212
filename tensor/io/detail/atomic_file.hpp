// Files written so that nothing is lost: the bytes go to a temporary file in the target's folder, which is flushed
// to the disk (fsync) and then renamed over the target, and the folder is synced. A crash or a kill at any point
// leaves either the old file or the new one, whole, under the target's name (POSIX rename is atomic); a temporary
// `.<name>.tmp-XXXXXX` may remain beside it after a crash, never under the target's name.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string_view>

namespace tapegrad::io {

// What write_atomically hands its callback: append bytes to the temporary file.
class FileSink {
 public:
  virtual ~FileSink() = default;
  virtual void write(const void* bytes, std::size_t count) = 0;
};

// Calls fill(sink) to write the new contents, then puts them in place as above. Throws tapegrad::Error naming `op`,
// the path and the system's reason when a step fails (the target is then untouched and the temporary removed); an
// exception from fill propagates the same way.
void write_atomically(const std::filesystem::path& path, const std::function<void(FileSink&)>& fill,
                      std::string_view op);

}  // namespace tapegrad::io
