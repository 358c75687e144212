#include "tapegrad/tensor/dist/detail/fingerprint.hpp"

#include <map>
#include <sstream>

namespace tapegrad::dist::detail {

namespace {
// Where each part sits in a Fingerprint.
enum Slot : std::size_t { number, op, flags, dtype, device, root, rank, first_dim };
static_assert(first_dim + Shape::max_rank <= Fingerprint{}.size());
constexpr std::int64_t has_tensor_flag = 1, undefined_flag = 2;
}  // namespace

std::string_view collective_name(Collective op) {
  switch (op) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::broadcast: return "broadcast";
    case Collective::barrier: return "barrier";
    case Collective::split: return "split";
  }
  return "?";
}

Fingerprint fingerprint_of(const Call& call) {
  Fingerprint f{};
  f[number] = call.number;
  f[op] = static_cast<std::int64_t>(call.op);
  f[flags] = (call.has_tensor ? has_tensor_flag : 0) | (call.defined ? 0 : undefined_flag);
  f[root] = call.root;
  if (call.has_tensor && call.defined) {
    f[dtype] = static_cast<std::int64_t>(call.dtype);
    f[device] = static_cast<std::int64_t>(call.device);
    f[rank] = call.shape.rank();
    for (int axis = 0; axis < call.shape.rank(); ++axis) f[first_dim + static_cast<std::size_t>(axis)] = call.shape[axis];
  }
  return f;
}

Call call_of(const Fingerprint& f) {
  Call call;
  call.number = f[number];
  call.op = static_cast<Collective>(f[op]);
  call.has_tensor = (f[flags] & has_tensor_flag) != 0;
  call.defined = (f[flags] & undefined_flag) == 0;
  call.root = static_cast<int>(f[root]);
  call.dtype = static_cast<DType>(f[dtype]);
  call.device = static_cast<Device::Kind>(f[device]);
  const auto rank_of = static_cast<std::size_t>(f[rank]);
  call.shape = Shape(std::span<const std::int64_t>(f.data() + first_dim, rank_of));
  return call;
}

std::string describe(const Call& call) {
  std::ostringstream out;
  out << collective_name(call.op) << " (call " << call.number << ")";
  if (call.has_tensor) {
    if (call.defined) {
      out << " of " << dtype_name(call.dtype) << ' ' << call.shape << " on "
          << (call.device == Device::Kind::cpu ? "cpu" : "cuda");
    } else {
      out << " of an undefined tensor";
    }
  }
  if (call.op == Collective::broadcast) out << " from root " << call.root;
  return out.str();
}

void agree(Group& group, const Call& call) {
  const std::vector<Fingerprint> all = group.disagreement(fingerprint_of(call));
  if (all.empty()) {
    if (call.defined) return;
    throw Error(tapegrad::detail::concat(collective_name(call.op), ": every rank of communicator '",
                                         group.options().name, "' passed an undefined tensor (", describe(call), ")"));
  }
  // Ranks with the same call are listed together: "ranks 0, 2: all_reduce ...; rank 1: ...".
  std::map<std::string, std::vector<int>> ranks_by_call;
  for (std::size_t r = 0; r < all.size(); ++r) ranks_by_call[describe(call_of(all[r]))].push_back(static_cast<int>(r));
  std::ostringstream out;
  out << "the " << group.size() << " ranks of communicator '" << group.options().name
      << "' did not call the same collective:";
  for (const auto& [what, ranks] : ranks_by_call) {
    out << (ranks.size() == 1 ? " rank " : " ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
    out << ": " << what << ';';
  }
  out << " (every rank must pass a defined tensor of the same dtype, shape and kind of device)";
  throw Error(tapegrad::detail::concat(collective_name(call.op), ": ", out.str()));
}

}  // namespace tapegrad::dist::detail
