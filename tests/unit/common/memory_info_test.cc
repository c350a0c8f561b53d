// The cgroup memory limit lookup on fake cgroup trees (v1 and v2), and the live readings.
#include "engine/common/memory_info.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(CgroupMemoryTest, V2LimitOfTheProcessCgroupOrAnAncestor) {
  testing::TempDir dir;
  const std::string root = dir.File("cg");
  WriteFile(dir.File("self"), "0::/kubepods/pod1/ctr\n");
  WriteFile(root + "/kubepods/pod1/ctr/memory.max", "max\n");
  WriteFile(root + "/kubepods/pod1/memory.max", "2147483648\n");
  WriteFile(root + "/kubepods/memory.max", "8589934592\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::optional<size_t>(2147483648u));
  WriteFile(root + "/kubepods/pod1/ctr/memory.max", "1073741824\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::optional<size_t>(1073741824u));
}

TEST(CgroupMemoryTest, V2WithoutLimitAndNamespacedRoot) {
  testing::TempDir dir;
  const std::string root = dir.File("cg");
  WriteFile(dir.File("self"), "0::/\n");
  WriteFile(root + "/memory.max", "max\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::nullopt);
  WriteFile(root + "/memory.max", "536870912\n");  // a container's own namespaced root
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::optional<size_t>(536870912u));
}

TEST(CgroupMemoryTest, V1LimitAndUnlimitedValue) {
  testing::TempDir dir;
  const std::string root = dir.File("cg");
  WriteFile(dir.File("self"), "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n");
  WriteFile(root + "/memory/memory.limit_in_bytes", "9223372036854771712\n");  // unlimited
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::nullopt);
  // Inside a container the controller is mounted at the container's own cgroup.
  WriteFile(root + "/memory/memory.limit_in_bytes", "3221225472\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::optional<size_t>(3221225472u));
  WriteFile(root + "/memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(root, dir.File("self")), std::optional<size_t>(1073741824u));
}

TEST(CgroupMemoryTest, UnreadableMeansNoLimit) {
  testing::TempDir dir;
  EXPECT_EQ(CgroupMemoryLimitBytes(dir.File("none"), dir.File("missing")), std::nullopt);
}

TEST(MemoryInfoTest, LiveReadingsAreConsistent) {
  const size_t phys = PhysicalMemoryBytes();
  const size_t rss = ProcessResidentBytes();
  EXPECT_GT(phys, 0u);
  EXPECT_GT(rss, 0u);
  EXPECT_LT(rss, phys);
  EXPECT_LE(AvailableHostMemoryBytes(), phys - rss + (64u << 20));  // RSS may move a little
}

}  // namespace
}  // namespace dcf
