// InitLogging: builds the process-wide spdlog logger. See common/logging.h.
//
// Thread-safety: see the header.
#include "common/logging.h"

#include <exception>
#include <memory>
#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace l2l {
namespace {

Result<spdlog::level::level_enum> ParseLevel(const std::string& level) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"off", spdlog::level::off},
  };
  for (const auto& [name, lvl] : kLevels) {
    if (level == name) return lvl;
  }
  return InvalidArgument("unknown log level '" + level + "' (expected trace, debug, info, warn, error or off)");
}

}  // namespace

Status InitLogging(const std::string& level, const std::string& file, const std::string& tag) {
  L2L_ASSIGN_OR_RETURN(spdlog::level::level_enum lvl, ParseLevel(level));
  try {
    std::vector<spdlog::sink_ptr> sinks;
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    if (!file.empty()) {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false));
    }
    auto logger = std::make_shared<spdlog::logger>(tag, sinks.begin(), sinks.end());
    // "2024-05-20 12:34:56.789 I eps 1234] message"
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %L %n %P] %v");
    logger->set_level(lvl);
    logger->flush_on(spdlog::level::warn);
    spdlog::set_default_logger(std::move(logger));
  } catch (const std::exception& e) {  // spdlog throws spdlog_ex, e.g. when the file cannot be opened
    return InvalidArgument("cannot set up logging" + (file.empty() ? "" : " to '" + file + "'") + ": " + e.what());
  }
  return Status::Ok();
}

Status SetLogLevel(const std::string& level) {
  L2L_ASSIGN_OR_RETURN(spdlog::level::level_enum lvl, ParseLevel(level));
  spdlog::set_level(lvl);
  return Status::Ok();
}

void FlushLogs() { spdlog::default_logger_raw()->flush(); }

}  // namespace l2l
