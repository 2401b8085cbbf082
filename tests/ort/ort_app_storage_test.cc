// Context binaries the application stores itself, here encrypted: ORT 1.29's experimental EPContext
// data callbacks. A compile through ORT's Compile API hands CtxgenRef's binary to the write
// function, which encrypts it (AES-256-CTR, nettle) before anything reaches the disk; a session
// reads it back through the read function, which decrypts it. Without the key, or with another,
// the session fails saying what it read.

#include <nettle/aes.h>
#include <nettle/ctr.h>

#include <gtest/gtest.h>

#include <atomic>

#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

using ReadNamedBuffer = OrtStatus*(ORT_API_CALL*)(void*, const char*, OrtAllocator*, void**, size_t*);
using WriteNamedBuffer = OrtStatus*(ORT_API_CALL*)(void*, const char*, const void*, size_t);
// Declared here: the npm build of ORT lacks the .inc that onnxruntime_experimental_c_api.h includes.
using SetReadFunc = OrtStatus*(ORT_API_CALL*)(OrtSessionOptions*, ReadNamedBuffer, void*);
using SetWriteFunc = OrtStatus*(ORT_API_CALL*)(OrtModelCompilationOptions*, WriteNamedBuffer, void*);

template <class Fn>
Fn experimental(const char* name) {
  auto* fn = reinterpret_cast<Fn>(Ort::GetApi().GetExperimentalFunction(name));
  if (fn == nullptr) throw std::runtime_error(std::string("this ONNX Runtime has no ") + name);
  return fn;
}

// The application's store: encrypted files in its folder, under the names CtxgenRef gives.
struct Vault {
  fs::path folder;
  std::array<uint8_t, 32> key{};
  std::atomic<int> reads{0};
  bool fail_reads = false;

  std::string crypt(const std::string& in) const {  // CTR: the same operation both ways
    aes256_ctx aes;
    aes256_set_encrypt_key(&aes, key.data());
    uint8_t counter[AES_BLOCK_SIZE] = {};
    std::string out(in.size(), '\0');
    ctr_crypt(&aes, reinterpret_cast<nettle_cipher_func*>(aes256_encrypt), AES_BLOCK_SIZE, counter, in.size(),
              reinterpret_cast<uint8_t*>(out.data()), reinterpret_cast<const uint8_t*>(in.data()));
    return out;
  }

  static OrtStatus* ORT_API_CALL write(void* state, const char* name, const void* buffer, size_t size) {
    const auto& vault = *static_cast<Vault*>(state);
    testing::write_file(vault.folder / name, vault.crypt(std::string(static_cast<const char*>(buffer), size)));
    return nullptr;
  }

  static OrtStatus* ORT_API_CALL read(void* state, const char* name, OrtAllocator* allocator, void** buffer,
                                      size_t* size) {
    auto& vault = *static_cast<Vault*>(state);
    ++vault.reads;
    if (vault.fail_reads) return Ort::GetApi().CreateStatus(ORT_FAIL, "the vault is locked");
    const std::string plain = vault.crypt(testing::read_file(vault.folder / name));
    *buffer = allocator->Alloc(allocator, plain.size());
    std::memcpy(*buffer, plain.data(), plain.size());
    *size = plain.size();
    return nullptr;
  }
};

class AppStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Plugin::register_library();
    original_ = copy_model("islands.onnx", dir_ / "in");
    vault_.folder = dir_ / "out";
    fs::create_directories(vault_.folder);
    for (size_t i = 0; i < vault_.key.size(); ++i) vault_.key[i] = static_cast<uint8_t>(7 * i + 1);
  }

  // Compiles the model with ORT's Compile API, the binary going through the vault.
  void compile() {
    Ort::SessionOptions options = plugin_options();
    Ort::ModelCompilationOptions compile(Plugin::env(), options);
    compile.SetInputModelPath(original_.c_str());
    compile.SetOutputModelPath((vault_.folder / "islands_ctx.onnx").c_str());
    Ort::ThrowOnError(experimental<SetWriteFunc>("OrtCompileApi_ModelCompilationOptions_SetEpContextDataWriteFunc_SinceV28")(
        compile, Vault::write, &vault_));
    Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
  }

  Ort::SessionOptions reading_options(const Config& config = {}) {
    Ort::SessionOptions options = plugin_options(config);
    Ort::ThrowOnError(
        experimental<SetReadFunc>("OrtApi_SessionOptions_SetEpContextDataReadFunc_SinceV28")(options, Vault::read, &vault_));
    return options;
  }

  testing::TempDir dir_;
  fs::path original_;
  Vault vault_;
};

TEST_F(AppStorageTest, TheBinaryGoesThroughTheApplicationEncryptedAndRunsDecrypted) {
  compile();
  EXPECT_EQ(files_in(vault_.folder), (std::set<std::string>{"islands_ctx.onnx", "islands_ref.bin"}));
  // No plaintext binary on disk: no file holds the format's magic.
  for (const auto& entry : fs::directory_iterator(vault_.folder))
    EXPECT_EQ(testing::read_file(entry.path()).find("CTXGENCB"), std::string::npos) << entry.path();
  Ort::Session session = open_session(vault_.folder / "islands_ctx.onnx", reading_options());
  EXPECT_EQ(vault_.reads, 1);
  expect_matches_original(session, original_);
}

TEST_F(AppStorageTest, WithoutTheKeyTheSessionFailsSayingWhatItRead) {
  compile();
  // No read function: the EP maps the file, which is ciphertext.
  auto failure = session_failure(vault_.folder / "islands_ctx.onnx", plugin_options());
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->message.find("not a ctxgen context binary: magic is"), std::string::npos) << failure->message;
  // Another key: the read function's bytes are no binary either.
  vault_.key[0] ^= 1;
  failure = session_failure(vault_.folder / "islands_ctx.onnx", reading_options());
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->message.find("'islands_ref.bin' from the application's EPContext data read function: not a ctxgen "
                                  "context binary"),
            std::string::npos)
      << failure->message;
  // The application's own error is passed on.
  vault_.fail_reads = true;
  failure = session_failure(vault_.folder / "islands_ctx.onnx", reading_options());
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->message.find("the application's EPContext data read function failed for 'islands_ref.bin': the "
                                  "vault is locked"),
            std::string::npos)
      << failure->message;
}

TEST_F(AppStorageTest, SharingSessionsReadTheBinaryOnce) {
  compile();
  {
    Ort::Session first = open_session(vault_.folder / "islands_ctx.onnx", reading_options({{"ep.share_ep_contexts", "1"}}));
    Ort::Session second = open_session(vault_.folder / "islands_ctx.onnx", reading_options({{"ep.share_ep_contexts", "1"}}));
    expect_matches_original(second, original_);
  }
  EXPECT_EQ(vault_.reads, 1);
}

}  // namespace
}  // namespace ctxgen::ort_test
