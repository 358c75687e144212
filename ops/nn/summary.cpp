#include "tapegrad/ops/nn/summary.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>

namespace tapegrad::nn {

namespace {

constexpr std::size_t no_call = std::numeric_limits<std::size_t>::max();

std::string with_separators(std::int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_bytes(std::int64_t bytes) {
  const struct {
    double size;
    const char* unit;
  } units[] = {{1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}};
  for (const auto& u : units) {
    if (static_cast<double>(bytes) > u.size) {
      char text[64];
      std::snprintf(text, sizeof text, "%.1f %s", static_cast<double>(bytes) / u.size, u.unit);
      return text;
    }
  }
  return with_separators(bytes) + " B";
}

// A cell is one or more lines of text.
using Cell = std::vector<std::string>;
using Row = std::vector<Cell>;

Cell describe_all(const TensorInfos& infos) {
  Cell cell;
  for (const TensorInfo& info : infos) cell.push_back(to_string(info));
  return cell;
}

Cell describe_parameters(const ParameterList& parameters) {
  Cell cell;
  for (const NamedParameter& p : parameters) {
    cell.push_back(p.path + ": " + to_string(TensorInfo{p.dtype(), p.shape(), p.device()}));
  }
  return cell;
}

// Boxes the rows (the first is the header) with '|' between columns and a rule under every row; the last column
// (sizes) is right-aligned below the header, and so is the cell before it in the last row (the "Total" label).
std::string render(const std::vector<Row>& rows) {
  const std::size_t columns = rows.front().size();
  std::vector<std::size_t> width(columns, 0);
  for (const Row& row : rows) {
    for (std::size_t c = 0; c < columns; ++c) {
      for (const std::string& line : row[c]) width[c] = std::max(width[c], line.size());
    }
  }
  auto rule = [&](char fill) {
    std::string s = "+";
    for (std::size_t w : width) s += std::string(w + 2, fill) + "+";
    return s + "\n";
  };
  std::string out = rule('-');
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::size_t height = 1;
    for (const Cell& cell : rows[r]) height = std::max(height, cell.size());
    for (std::size_t line = 0; line < height; ++line) {
      out += "|";
      for (std::size_t c = 0; c < columns; ++c) {
        const std::string text = line < rows[r][c].size() ? rows[r][c][line] : "";
        const std::string pad(width[c] - text.size(), ' ');
        const bool right = r > 0 && (c + 1 == columns || (r + 1 == rows.size() && c + 2 == columns));
        out += ' ';
        out += right ? pad + text : text + pad;
        out += " |";
      }
      out += "\n";
    }
    out += rule(r == 0 ? '=' : '-');
  }
  return out;
}

// The parameter count and bytes of a list.
std::pair<std::int64_t, std::int64_t> total_size(const ParameterList& parameters) {
  std::int64_t count = 0, bytes = 0;
  for (const NamedParameter& p : parameters) {
    count += p.numel();
    bytes += p.bytes();
  }
  return {count, bytes};
}

}  // namespace

std::string format_size(std::int64_t count, std::int64_t bytes) {
  return with_separators(count) + " (" + format_bytes(bytes) + ")";
}

std::string ModelSummary::table() const {
  std::vector<Row> rows{{{"path"}, {"module"}, {"inputs"}, {"outputs"}, {"parameters"}, {"size (with children)"}}};
  for (const SummaryRow& row : this->rows) {
    Cell module{row.type};
    module.insert(module.end(), row.notes.begin(), row.notes.end());
    rows.push_back({{row.path}, std::move(module), describe_all(row.inputs), describe_all(row.outputs),
                    describe_parameters(row.own_parameters), {format_size(row.parameter_count, row.parameter_bytes)}});
  }
  rows.push_back({{}, {}, {}, {}, {"Total"}, {format_size(parameter_count, parameter_bytes)}});
  return render(rows) + "Total parameters: " + format_size(parameter_count, parameter_bytes) + "\n";
}

namespace detail {

namespace {
void add_paths(const Module& module, const std::string& prefix, std::unordered_map<const Module*, std::string>& paths) {
  for (const Module::Child& child : module.children()) {
    const std::string path = prefix.empty() ? child.name : prefix + "." + child.name;
    paths.emplace(child.module, path);
    add_paths(*child.module, path, paths);
  }
}
}  // namespace

SummaryRecorder::SummaryRecorder(const Module& root) : root_(root), scope_(*this) {
  paths_.emplace(&root, root.type_name());
  add_paths(root, "", paths_);
}

std::size_t SummaryRecorder::begin(const Module& module, TensorInfos inputs) {
  // summary() reports the root's call itself; the root's own report of the same call is not a second row.
  if (!open_.empty() && modules_[open_.back()] == &module) return no_call;
  const auto path = paths_.find(&module);
  SummaryRow row{.path = path != paths_.end() ? path->second : "(unregistered)",
                 .type = module.type_name(),
                 .notes = module.summary_notes(),
                 .inputs = std::move(inputs),
                 .outputs = {},
                 .own_parameters = module.own_parameters()};
  std::tie(row.parameter_count, row.parameter_bytes) = total_size(module.parameters());
  summary_.rows.push_back(std::move(row));
  modules_.push_back(&module);
  open_.push_back(summary_.rows.size() - 1);
  return open_.back();
}

void SummaryRecorder::end(std::size_t call, TensorInfos outputs) {
  if (call == no_call) return;
  summary_.rows[call].outputs = std::move(outputs);
  open_.pop_back();
}

ModelSummary SummaryRecorder::finish() && {
  std::tie(summary_.parameter_count, summary_.parameter_bytes) = total_size(root_.parameters());
  return std::move(summary_);
}

}  // namespace detail

}  // namespace tapegrad::nn
