// Test-only helpers for tests/formats: run the oracle venv's python (scripts/oracle_venv.sh;
// a missing venv fails the test, never skips it) and the tests/formats/*.py scripts.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace l2l::testing {

// Runs `cmd` through the shell; returns its exit status and stdout+stderr in *out.
inline int RunShell(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int rc = ::pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The oracle venv's python; REQUIREs that scripts/oracle_venv.sh made it.
inline std::string OraclePython() {
  static std::string py;
  if (!py.empty()) return py;
  std::string out;
  const int rc = RunShell("bash " + ShellQuote(std::string(L2L_SOURCE_DIR) + "/scripts/oracle_venv.sh") + " 2>/dev/null", &out);
  INFO("scripts/oracle_venv.sh failed: " << out);
  REQUIRE(rc == 0);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  const size_t nl = out.rfind('\n');
  py = nl == std::string::npos ? out : out.substr(nl + 1);
  return py;
}

// Runs tests/formats/<script> with the oracle python and HF_HUB_OFFLINE=1; REQUIREs exit 0.
inline std::string RunOracle(const std::string& script, const std::vector<std::string>& args) {
  std::string cmd = "HF_HUB_OFFLINE=1 " + ShellQuote(OraclePython()) + " " +
                    ShellQuote(std::string(L2L_SOURCE_DIR) + "/tests/formats/" + script);
  for (const std::string& a : args) cmd += " " + ShellQuote(a);
  std::string out;
  const int rc = RunShell(cmd, &out);
  INFO(cmd << "\n" << out);
  REQUIRE(rc == 0);
  return out;
}

inline std::vector<float> ReadF32File(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), v.size() * 4);
  return v;
}

inline void WriteF32File(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  REQUIRE(f.good());
}

inline void WriteFileForTest(const std::string& path, const std::string& contents) {
  std::ofstream f(path, std::ios::binary);
  f << contents;
  REQUIRE(f.good());
}

// Bitwise equality of two fp32 arrays (NaN payloads and signed zeros included).
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace l2l::testing
